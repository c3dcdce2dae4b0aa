"""The typed report (issue 29): `analyze --json` is the report encoded, `rankscope report saved.json`
shows it again as `analyze` did, and the shipped JSON Schema is the one the report's types give.

Expected outputs come from `analyze` itself, run as a user runs it (the CLI, 80 columns): the saved
report must reproduce its terminal text and its HTML page byte for byte. The schema's oracle is the
JSON Schema validator (jsonschema), which reads the saved object with the standard library."""
from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import msgspec
import pytest

from conftest import DLRM, assert_no_traceback, run_cli
from rankscope.render.json import schema_text
from rankscope.results import Analysis

DATA = Path(__file__).parent / "data"

#: Several kinds of report: GPU ranks with collectives, a pipeline, a CPU job with a straggler, one GPU
#: rank, Flight Recorder dumps alone (a hang), a run of profiler cycles, dumps beside their traces.
SETS = {"dlrm": ("corpus", DLRM), "pp4-slowstage2": ("corpus", "cpu-gloo-pp4-slowstage2"),
        "gloo-straggler": ("corpus", "cpu-gloo-4rank-straggler"), "resnet": ("corpus", "kineto-resnet50-workers0"),
        "hang": ("corpus", "fr-gloo-4rank-late"), "run": ("corpus", "cpu-gloo-2rank-cycles"),
        "hang-beside-traces": ("data", "hangs/hang-late")}


def _folder(corpus: Path, where: str, name: str) -> Path:
    return corpus / name if where == "corpus" else DATA / name


@pytest.mark.parametrize("name", sorted(SETS))
def test_saved_report_shows_what_analyze_showed(corpus, tmp_path, name):
    folder = _folder(corpus, *SETS[name])
    env = {"COLUMNS": "80"}
    saved = tmp_path / "saved.json"
    as_json = run_cli(["analyze", folder, "--json", "-q", "--no-cache"], tmp_path, env=env)
    assert as_json.returncode in (0, 1), as_json.stderr
    saved.write_text(as_json.stdout)
    shown = run_cli(["analyze", folder, "--no-cache", "--html", tmp_path / "analyze.html"], tmp_path, env=env)
    again = run_cli(["report", saved, "--html", tmp_path / "report.html"], tmp_path, env=env)
    assert_no_traceback(again)
    assert again.returncode == 0, again.stderr
    assert again.stdout == shown.stdout
    assert (tmp_path / "report.html").read_text() == (tmp_path / "analyze.html").read_text()
    # Analysis.load gives back the object --json encoded
    assert msgspec.json.encode(Analysis.load(saved)) == msgspec.json.encode(json.loads(as_json.stdout))


def test_report_of_no_report_is_one_line(tmp_path):
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    (tmp_path / "cut.json").write_text('{"schema": "rankscope.analysis/1", "job": {')
    for path, words in ((tmp_path / "trace.json", "not a rankscope.analysis/1 report"),
                        (tmp_path / "cut.json", "not a rankscope.analysis/1 report"),
                        (tmp_path / "missing.json", "cannot read")):
        proc = run_cli(["report", path], tmp_path)
        assert_no_traceback(proc)
        assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_shipped_schema_is_the_generated_one():
    """src/rankscope/schemas/analysis.schema.json is what the report's types give (regenerate with
    `python -m rankscope.render.json > src/rankscope/schemas/analysis.schema.json`)."""
    assert files("rankscope").joinpath("schemas/analysis.schema.json").read_text() == schema_text()


def test_schema_rejects_what_the_types_reject(corpus, tmp_path):
    """The generated schema is a contract, not a formality: a report with a severity outside the
    vocabulary, or a rank row without its file, is invalid to it (and to Analysis.load)."""
    import jsonschema
    schema = json.loads(files("rankscope").joinpath("schemas/analysis.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    proc = run_cli(["analyze", corpus / "cpu-gloo-4rank-straggler", "--json", "-q"], tmp_path)
    good = json.loads(proc.stdout)
    validator.validate(good)
    bad_severity = json.loads(proc.stdout)
    bad_severity["findings"][0]["severity"] = "urgent"
    no_file = json.loads(proc.stdout)
    del no_file["ranks"][0]["file"]
    for bad in (bad_severity, no_file):
        assert list(validator.iter_errors(bad))
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(json.dumps(bad), type=Analysis)
