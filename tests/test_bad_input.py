"""Bad input (DESIGN.md "Bad input"): every bad file gets a one-line problem naming it, the other
ranks still load, nothing is ever written to the inputs.

Most tests build a private copy of the complete 8-rank param-dlrm job (ranks 0..7, world_size 8
per the files' own distributedInfo) and damage or add one file. Expected event counts come from
the standard library (`complete_events_in_prefix`, json) in conftest.py.
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import (DLRM, assert_no_traceback, complete_events_in_prefix, corpus_files, fresh_json,
                      gunzip_prefix, raw_text, run_cli, sha256_tree, shared_cache_dir, write_trace, x_events)
from rankscope import api
from rankscope.ingest.errors import TraceError
from rankscope.ingest.kineto import read_kineto
from rankscope.pipelines.run import analyze_cycles

RANK7 = "worker7_step_12.1694128201553.pt.trace.json.gz"


def analyze_dir(d: Path, **kw) -> api.Analysis:
    """api.analyze in-process, with the session's shared cache (the untouched good ranks are parsed
    once per session; a damaged or new file has new content/mtime, so it is always parsed)."""
    kw.setdefault("cache_dir", shared_cache_dir())
    kw.setdefault("engine", "inprocess")
    return analyze_cycles(d, **kw)


def one_line(text: str) -> bool:
    return bool(text.strip()) and "\n" not in text and "\r" not in text


def problems_for(result: api.Analysis, path: Path) -> list:
    return [p for p in result.problems if Path(p.file).name == path.name]


def assert_other_ranks_loaded(result: api.Analysis, expected_ranks: list[int]) -> None:
    got = sorted(s.rank for s in result.summaries)
    assert got == expected_ranks, f"ranks loaded {got}, expected {expected_ranks}; problems: {[str(p) for p in result.problems]}"


def rank7_text(job: Path) -> bytes:
    return raw_text(job / RANK7)


def replace_rank7(job: Path, data: bytes, name: str = "worker7_step_12.1694128201553.pt.trace.json") -> Path:
    (job / RANK7).unlink()
    p = job / name
    p.write_bytes(data)
    return p


# ----------------------------------------------------------------------------------------------
# Truncated JSON
def _boundary(text: bytes, k: int) -> re.Match:
    """The k-th `}, {` between two events of the event list (plain regex on the text)."""
    start = text.index(b'"traceEvents"')
    return [m for m in re.finditer(rb"\}\s*,\s*\{", text[start:])][k], start


def cut_mid_header(t: bytes) -> int:
    return t.index(b'"deviceProperties"') + 40


def cut_mid_event(t: bytes) -> int:
    return len(t) // 2


def cut_early_event(t: bytes) -> int:
    return t.index(b'"traceEvents"') + 3000


def cut_after_next_open_brace(t: bytes) -> int:
    m, s = _boundary(t, 1000)
    return s + m.end()


def cut_after_comma(t: bytes) -> int:
    m, s = _boundary(t, 1000)
    return s + m.start() + 2          # "}," kept


def cut_after_brace(t: bytes) -> int:
    m, s = _boundary(t, 1000)
    return s + m.start() + 1          # "}" kept


def cut_before_closing_bracket(t: bytes) -> int:
    return t.rindex(b"]")             # every event complete, the list not closed


SALVAGE_CUTS = [
    pytest.param(cut_mid_event, id="mid-event"),
    pytest.param(cut_early_event, id="first-events"),
    pytest.param(cut_after_next_open_brace, id="after-next-open-brace"),
    pytest.param(cut_after_comma, id="between-events-after-comma"),
    pytest.param(cut_after_brace, id="between-events-after-brace"),
    pytest.param(cut_before_closing_bracket, id="after-last-event"),
]


@pytest.mark.parametrize("cut", SALVAGE_CUTS)
def test_truncated_json_salvages_complete_events(dlrm_dir: Path, cut):
    """Every complete event before the cut is kept (count from json.JSONDecoder.raw_decode over the
    prefix), the trace says it was salvaged, and one problem line says how many."""
    text = rank7_text(dlrm_dir)
    prefix = text[:cut(text)]
    expected = complete_events_in_prefix(prefix)
    assert expected > 0
    bad = replace_rank7(dlrm_dir, prefix)

    trace, _ = read_kineto(bad)
    assert trace.meta.salvaged is True
    assert trace.meta.events_total == expected, f"salvaged {trace.meta.events_total}, prefix holds {expected} complete events"
    lines = [p for p in trace.meta.problems if "salvaged" in p]
    assert len(lines) == 1 and one_line(lines[0]) and str(expected) in lines[0], trace.meta.problems

    result = analyze_dir(dlrm_dir)
    assert_other_ranks_loaded(result, list(range(8)))
    mine = problems_for(result, bad)
    assert mine and all(not p.fatal and one_line(p.problem) for p in mine)
    assert next(s for s in result.summaries if s.rank == 7).meta.salvaged


def test_truncated_json_mid_header_is_a_one_line_error(dlrm_dir: Path):
    """Cut inside deviceProperties: no event at all (independent count 0): a one-line TraceError,
    and the 7 other ranks load; rank 7 is then missing."""
    text = rank7_text(dlrm_dir)
    prefix = text[:cut_mid_header(text)]
    assert complete_events_in_prefix(prefix) == 0
    bad = replace_rank7(dlrm_dir, prefix)
    with pytest.raises(TraceError) as exc:
        read_kineto(bad)
    assert one_line(str(exc.value))
    result = analyze_dir(dlrm_dir)
    assert_other_ranks_loaded(result, list(range(7)))
    (p,) = problems_for(result, bad)
    assert p.fatal and one_line(p.problem)
    assert result.job.missing_ranks == [7]


def test_truncated_header_message_says_truncated(dlrm_dir: Path):
    """The one-line error of a file cut in its header names the truncation (not "not a trace")."""
    text = rank7_text(dlrm_dir)
    bad = replace_rank7(dlrm_dir, text[:cut_mid_header(text)])
    with pytest.raises(TraceError, match=r"(?i)trunc|cut|ends"):
        read_kineto(bad)


@pytest.mark.parametrize("fraction", [0.5, 0.9])
def test_truncated_gzip_salvages_what_decompresses(dlrm_dir: Path, fraction: float):
    """The compressed bytes cut: the events that zlib can still decompress (fed in small pieces)
    and that are complete are kept."""
    data = (dlrm_dir / RANK7).read_bytes()
    cut = data[:int(len(data) * fraction)]
    expected = complete_events_in_prefix(gunzip_prefix(cut))
    assert expected > 0
    bad = replace_rank7(dlrm_dir, cut, name=RANK7)
    trace, _ = read_kineto(bad)
    assert trace.meta.salvaged
    assert trace.meta.events_total == expected
    assert any(str(expected) in p and one_line(p) for p in trace.meta.problems), trace.meta.problems
    result = analyze_dir(dlrm_dir)
    assert_other_ranks_loaded(result, list(range(8)))


def _corrupt_middle(data: bytes) -> bytes:
    b = bytearray(data)
    mid = len(b) // 2
    for i in range(mid, mid + 20):
        b[i] ^= 0xFF
    return bytes(b)


def test_corrupt_gzip_is_one_line_and_others_load(dlrm_dir: Path):
    """20 bytes flipped in the middle of the compressed stream: either a one-line error naming
    the decompression problem, or a salvaged trace with a problem line; never an exception."""
    bad = replace_rank7(dlrm_dir, _corrupt_middle((dlrm_dir / RANK7).read_bytes()), name=RANK7)
    try:
        trace, _ = read_kineto(bad)
    except TraceError as exc:
        assert one_line(str(exc)) and re.search(r"(?i)gzip|decompress|corrupt", str(exc)), str(exc)
    else:
        assert trace.meta.salvaged and trace.meta.problems
    result = analyze_dir(dlrm_dir)
    assert {0, 1, 2, 3, 4, 5, 6} <= {s.rank for s in result.summaries}
    mine = problems_for(result, bad)
    assert mine and all(one_line(p.problem) for p in mine)


def test_corrupt_gzip_salvages_events_before_the_damage(dlrm_dir: Path):
    """Events inflated before the damaged gzip bytes are kept (kineto.reading._chunks docstring): at least
    the complete events before the first byte that differs from the original text."""
    original = rank7_text(dlrm_dir)
    damaged = _corrupt_middle((dlrm_dir / RANK7).read_bytes())
    text = gunzip_prefix(damaged)
    same = next(i for i, (a, b) in enumerate(zip(original, text)) if a != b)   # first damaged byte
    before = complete_events_in_prefix(original[:same])
    assert before > 100
    bad = replace_rank7(dlrm_dir, damaged, name=RANK7)
    trace, _ = read_kineto(bad)
    assert trace.meta.salvaged and trace.meta.events_total >= before


def test_garbage_near_the_end_salvages_events_before_it(dlrm_dir: Path):
    """'@@garbage@@' inserted between two events near the end (50 events before the last):
    the events before it are kept (count by raw_decode of the text before the garbage)."""
    text = rank7_text(dlrm_dir)
    n = len(list(re.finditer(rb"\}\s*,\s*\{", text)))
    m, s = _boundary(text, n - 60)
    pos = s + m.start() + 2
    expected = complete_events_in_prefix(text[:pos])
    bad = replace_rank7(dlrm_dir, text[:pos] + b" @@garbage@@ " + text[pos:])
    trace, _ = read_kineto(bad)
    assert trace.meta.salvaged
    assert trace.meta.events_total >= expected - 1
    assert trace.meta.events_total <= expected


def test_garbage_in_the_middle_salvages_events_before_it(dlrm_dir: Path):
    """Garbage between two events mid-file: the 1600+ complete events before it are kept and the
    problem says the JSON is invalid (regression: all lost, reported as truncation)."""
    text = rank7_text(dlrm_dir)
    m, s = _boundary(text, 1600)
    pos = s + m.start() + 2
    expected = complete_events_in_prefix(text[:pos])
    bad = replace_rank7(dlrm_dir, text[:pos] + b" @@garbage@@ " + text[pos:])
    try:
        trace, _ = read_kineto(bad)
    except TraceError as exc:
        pytest.fail(f"TraceError: {exc}")
    assert trace.meta.salvaged and trace.meta.events_total >= expected - 1
    assert any("invalid" in p.lower() for p in trace.meta.problems), trace.meta.problems


def test_braces_inside_strings_at_chunk_boundary(tmp_path: Path):
    """A file over one chunk whose strings hold '}, {' (regression: taken as event boundaries)
    reads whole: 70,000 events (hand count: the list built here), not salvaged, no problem."""
    events = [{"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": i, "dur": 1,
               "name": "step {epoch}, {batch} " + "x" * 100} for i in range(70_000)]      # ~13.8 MB
    p = write_trace(tmp_path / "big.json", {"traceEvents": events})
    trace, _ = read_kineto(p)
    assert (trace.meta.events_total, trace.meta.salvaged, trace.meta.problems) == (70_000, False, [])


# ----------------------------------------------------------------------------------------------
# Files that hold no trace
NOT_TRACES = {
    "empty": (b"", r"(?i)empty"),
    "whitespace": (b"  \n\t ", r"(?i)empty"),
    "object-not-trace": (b'{"a": 1}', r"(?i)not a (profiler )?trace|traceEvents"),
    "array-of-ints": (b"[1, 2]", r"(?i)trace"),
    "json-string": (b'"str"', r"(?i)not json|not a"),
    "json-null": (b"null", r"(?i)not json|not a"),
    "text": (b"this is not JSON at all\n", r"(?i)not json"),
    "binary": (bytes(range(256)) * 20, r"(?i)not json|decompress|gzip"),
    "empty-event-list": (b'{"traceEvents": []}', r"(?i)no trace events|no events"),
    "gzip-of-empty": (gzip.compress(b""), r"(?i)empty"),
    "gzip-of-text": (gzip.compress(b"hello"), r"(?i)not json"),
    "gzip-header-only": (gzip.compress(b'{"traceEvents": [1,2,3]}')[:12], r"(?i)gzip|decompress|cut|trunc"),
}


@pytest.mark.parametrize("case", list(NOT_TRACES), ids=list(NOT_TRACES))
def test_not_a_trace_is_a_one_line_error_and_others_load(dlrm_dir: Path, case: str):
    data, pattern = NOT_TRACES[case]
    bad = dlrm_dir / ("extra.pt.trace.json.gz" if data[:2] == b"\x1f\x8b" else "extra.pt.trace.json")
    bad.write_bytes(data)
    with pytest.raises(TraceError) as exc:
        read_kineto(bad)
    msg = str(exc.value)
    assert one_line(msg) and re.search(pattern, msg), msg
    result = analyze_dir(dlrm_dir)
    assert_other_ranks_loaded(result, list(range(8)))
    (p,) = problems_for(result, bad)
    assert p.fatal and one_line(p.problem)
    assert not result.job.missing_ranks


def test_folder_mixing_traces_and_other_files(dlrm_dir: Path):
    """A .txt and a .pickle next to the traces are reported (by name, one line each, not fatal),
    a hidden file is not, and all 8 ranks load."""
    (dlrm_dir / "notes.txt").write_text("hello")
    (dlrm_dir / "model.pickle").write_bytes(b"\x80\x04\x95")
    (dlrm_dir / ".hidden").write_text("x")
    result = analyze_dir(dlrm_dir)
    assert_other_ranks_loaded(result, list(range(8)))
    for name in ("notes.txt", "model.pickle"):
        (p,) = [p for p in result.problems if Path(p.file).name == name]
        assert not p.fatal and one_line(p.problem)
    assert not [p for p in result.problems if Path(p.file).name == ".hidden"]


def test_two_files_claiming_one_rank(dlrm_dir: Path):
    """A copy of rank 0 under another name: both say distributedInfo.rank 0; one is kept, the
    other is skipped with one line naming the rank and the other file."""
    shutil.copyfile(dlrm_dir / "worker0_step_12.1694128201545.pt.trace.json.gz", dlrm_dir / "zz_copy.pt.trace.json.gz")
    result = analyze_dir(dlrm_dir)
    assert_other_ranks_loaded(result, list(range(8)))
    dup = [p for p in result.problems if "rank 0" in p.problem]
    assert len(dup) == 1 and dup[0].fatal and one_line(dup[0].problem)
    names = {Path(dup[0].file).name} | {n for n in ("worker0_step_12.1694128201545.pt.trace.json.gz", "zz_copy.pt.trace.json.gz")
                                        if n in dup[0].problem}
    assert names == {"worker0_step_12.1694128201545.pt.trace.json.gz", "zz_copy.pt.trace.json.gz"}


def test_missing_ranks(dlrm_dir: Path, corpus: Path):
    """6 of 8 ranks (world_size 8 from distributedInfo): ranks 6 and 7 reported missing."""
    world = fresh_json(corpus_files(corpus, DLRM)[0])["distributedInfo"]["world_size"]
    assert world == 8
    for f in sorted(dlrm_dir.iterdir())[6:]:
        f.unlink()
    result = analyze_dir(dlrm_dir)
    assert_other_ranks_loaded(result, list(range(6)))
    assert result.job.world_size == world
    assert result.job.missing_ranks == [6, 7]
    assert any("missing" in w and "6" in w and "7" in w for w in result.job.warnings), result.job.warnings


def test_negative_durations_are_dropped_and_reported(dlrm_dir: Path):
    """Three X events of rank 7 get dur -5: those three are dropped (hand count), one problem line
    says so, every other event is there with its own dur (from json)."""
    doc = fresh_json(dlrm_dir / RANK7)
    xs = x_events(doc)
    targets = [10, 500, len(xs) - 1]
    for i in targets:
        xs[i]["dur"] = -5
    bad = write_trace(dlrm_dir / RANK7, doc)
    trace, _ = read_kineto(bad)
    kept = [e for i, e in enumerate(xs) if i not in targets]
    assert trace.events["dur_ns"].to_list() == [round(e["dur"] * 1000) for e in kept]
    assert trace.meta.dropped == {"dur negative": 3}
    (line,) = [p for p in trace.meta.problems if "negative" in p]
    assert one_line(line) and line == "3 events dropped: 3 with dur negative"
    result = analyze_dir(dlrm_dir)
    assert_other_ranks_loaded(result, list(range(8)))
    assert any("negative" in p.problem and not p.fatal for p in problems_for(result, bad))


# ----------------------------------------------------------------------------------------------
# Badly typed events
WRONG_TYPES = {
    "args-list": ("args", []),
    "ts-string": ("ts", "abc"),
    "dur-null": ("dur", None),
    "name-number": ("name", 5),
    "cat-number": ("cat", 7),
    "pid-list": ("pid", [1]),
    "tid-object": ("tid", {"a": 1}),
}


def _doc_with_bad_event(path: Path, field: str, value, k: int):
    doc = fresh_json(path)
    xs = x_events(doc)
    xs[k][field] = value
    return doc, xs


@pytest.mark.parametrize("case", list(WRONG_TYPES), ids=list(WRONG_TYPES))
def test_wrong_types_do_not_lose_the_other_events(dlrm_dir: Path, case: str):
    """One X event (X#1000 of rank 7) with a badly typed field: every other X event is still there,
    in order, with its name (names from json); the bad one is kept or dropped, nothing else."""
    field, value = WRONG_TYPES[case]
    k = 1000
    doc, xs = _doc_with_bad_event(dlrm_dir / RANK7, field, value, k)
    bad = write_trace(dlrm_dir / RANK7, doc)
    trace, _ = read_kineto(bad)
    names = trace.events["name"].cast(str).to_list()
    expected = [e["name"] for e in xs]
    if len(names) == len(xs):
        assert [n for i, n in enumerate(names) if i != k] == [n for i, n in enumerate(expected) if i != k]
    else:
        assert len(names) == len(xs) - 1, f"{len(xs) - len(names)} events lost"
        assert names == expected[:k] + expected[k + 1:]
        assert any(w in p for p in trace.meta.problems for w in ("malformed", "skipped", "dropped")), \
            trace.meta.problems
    assert all(one_line(p) for p in trace.meta.problems)
    result = analyze_dir(dlrm_dir)
    assert_other_ranks_loaded(result, list(range(8)))


def test_event_with_number_name_does_not_take_another_name(dlrm_dir: Path):
    """A non-string name is shown as null/"" (regression: it took the name of the first event)."""
    k = 1000
    doc, xs = _doc_with_bad_event(dlrm_dir / RANK7, "name", 5, k)
    bad = write_trace(dlrm_dir / RANK7, doc)
    trace, _ = read_kineto(bad)
    name = trace.events["name"].cast(str).to_list()[k]
    assert name in (None, "", "5"), f"X#{k} (name 5) is shown as {name!r}; first event is {xs[0]['name']!r}"


def test_repaired_events_are_reported(dlrm_dir: Path):
    """An event repaired on the lenient path ("args": [] dropped) is counted in the problems
    (the kineto package docstring, item 2)."""
    doc, _ = _doc_with_bad_event(dlrm_dir / RANK7, "args", [], 1000)
    trace, _ = read_kineto(write_trace(dlrm_dir / RANK7, doc))
    assert trace.meta.problems, "the repaired event is not reported"


def test_non_object_elements_are_counted(dlrm_dir: Path):
    """`5` and `null` inside traceEvents: skipped, counted ("2 malformed"), every event kept."""
    doc = fresh_json(dlrm_dir / RANK7)
    n_events = len(doc["traceEvents"])
    doc["traceEvents"].insert(100, 5)
    doc["traceEvents"].insert(200, None)
    trace, _ = read_kineto(write_trace(dlrm_dir / RANK7, doc))
    assert trace.meta.events_total == n_events
    assert any(re.search(r"\b2\b.*malformed", p) for p in trace.meta.problems), trace.meta.problems


def test_lone_surrogate_in_a_name(tmp_path: Path):
    """A lone surrogate escape (valid JSON syntax, accepted by Python's json) neither crashes the
    reader (regression: UnicodeEncodeError from polars) nor loses the other event."""
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [{"ph": "X", "name": "ok", "ts": 1, "dur": 1, "pid": 1, "tid": 1},'
                 ' {"ph": "X", "name": "bad \\ud800", "ts": 2, "dur": 1, "pid": 1, "tid": 1}]}')
    try:
        trace, _ = read_kineto(p)
    except TraceError:
        return
    assert len(trace.events) >= 1


def test_no_gpu_events(corpus: Path):
    """hta-rank-non-gpu (MANIFEST: no GPU events): analysed as a CPU-only job, with a warning."""
    result = analyze_dir(corpus / "hta-rank-non-gpu")
    assert len(result.summaries) == 1 and not result.skipped
    assert any("no GPU events" in w for w in result.job.warnings), result.job.warnings


# ----------------------------------------------------------------------------------------------
# The command line on a folder with every kind of fatal bad file; inputs never modified
def _bad_folder(job: Path) -> dict[str, str]:
    """Adds fatal bad files to the 8-rank job; returns {file name: expected message pattern}."""
    bad = {
        "empty.pt.trace.json": (b"", "empty"),
        "object.pt.trace.json": (b'{"a": 1}', "trace"),
        "text.pt.trace.json": (b"not json\n", "JSON"),
        "junk.pt.trace.json.gz": (b"\x1f\x8b" + bytes(range(256)) * 4, "gzip|decompress"),
        "corrupt.pt.trace.json.gz": (_corrupt_middle((job / RANK7).read_bytes()), "gzip|decompress|corrupt"),
    }
    for name, (data, _) in bad.items():
        (job / name).write_bytes(data)
    (job / "notes.txt").write_text("not a trace")
    return {name: pat for name, (_, pat) in bad.items()}


def test_cli_bad_files_one_line_each_and_exit_1(dlrm_dir: Path, tmp_path: Path):
    bad = _bad_folder(dlrm_dir)
    before = sha256_tree(dlrm_dir)
    proc = run_cli(["analyze", dlrm_dir, "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert all(ln.startswith("rankscope: ") for ln in lines), lines
    for name, pattern in bad.items():
        mine = [ln for ln in lines if name in ln]
        assert len(mine) == 1, f"{name}: {mine}"
        assert re.search(pattern, mine[0], re.IGNORECASE), mine[0]
    assert [ln for ln in lines if "notes.txt" in ln], "the .txt file is not mentioned"
    assert sha256_tree(dlrm_dir) == before, "an input file was modified"


def test_cli_json_lists_skipped_files(dlrm_dir: Path, tmp_path: Path):
    bad = _bad_folder(dlrm_dir)
    proc = run_cli(["analyze", dlrm_dir, "--json", "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert sorted(r["rank"] for r in out["ranks"]) == list(range(8))
    assert sorted(Path(s["file"]).name for s in out["inputs"]["skipped"]) == sorted(bad)


def test_cli_nothing_usable_exits_2(tmp_path: Path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "a.pt.trace.json").write_bytes(b"")
    (d / "b.pt.trace.json").write_text("{")
    proc = run_cli(["analyze", d, "--no-cache"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert all(ln.startswith("rankscope: ") for ln in lines), lines
    assert len([ln for ln in lines if "a.pt.trace.json" in ln]) == 1
    assert len([ln for ln in lines if "b.pt.trace.json" in ln]) == 1


def test_cli_missing_path_exits_2(tmp_path: Path):
    proc = run_cli(["analyze", tmp_path / "does-not-exist", "--no-cache"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2
    assert "does-not-exist" in proc.stderr


def test_inputs_never_modified_by_the_api_with_cache(dlrm_dir: Path, tmp_path: Path):
    """Parsing, salvaging and caching (two runs, cache written then read) change no input byte,
    and no file appears in the input folder."""
    _bad_folder(dlrm_dir)
    text = rank7_text(dlrm_dir)
    replace_rank7(dlrm_dir, text[:len(text) // 2])
    before = sha256_tree(dlrm_dir)
    for _ in range(2):
        analyze_dir(dlrm_dir, cache_dir=tmp_path / "cache")
    assert sha256_tree(dlrm_dir) == before


def test_local_process_pool_engine_survives_bad_files(dlrm_dir: Path):
    """The same bad folder through the local process pool: same ranks and problems as in-process."""
    _bad_folder(dlrm_dir)
    a = analyze_dir(dlrm_dir, engine="inprocess", use_cache=False)
    b = analyze_dir(dlrm_dir, engine="local", workers=2, use_cache=False)
    assert [s.rank for s in b.summaries] == [s.rank for s in a.summaries] == list(range(8))
    key = lambda p: (Path(p.file).name, p.problem, p.fatal)  # noqa: E731
    assert sorted(map(key, b.problems)) == sorted(map(key, a.problems))


def test_invalid_utf8_in_an_event(tmp_path: Path):
    p = tmp_path / "t.json"
    p.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "ok", "ts": 1, "dur": 1, "pid": 1, "tid": 1},'
                  b' {"ph": "X", "name": "b\x80d", "ts": 2, "dur": 1, "pid": 1, "tid": 1}]}')
    try:
        trace, _ = read_kineto(p)
    except TraceError:
        return
    assert len(trace.events) >= 1


def test_invalid_utf8_in_the_header(tmp_path: Path):
    p = tmp_path / "t.json"
    p.write_bytes(b'{"host_name": "h\x80", "traceEvents": [{"ph": "X", "name": "ok", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}')
    trace, _ = read_kineto(p)
    assert len(trace.events) == 1


def test_invalid_utf8_does_not_stop_the_other_ranks(dlrm_dir: Path):
    """Whatever read_kineto does with it, the analysis goes on with the 8 good ranks and reports the
    bad file on one line."""
    bad = dlrm_dir / "extra.pt.trace.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "b\x80d", "ts": 2, "dur": 1, "pid": 1, "tid": 1}]}')
    result = analyze_dir(dlrm_dir)
    assert {s.rank for s in result.summaries} >= set(range(8))
    assert all(one_line(p.problem) for p in result.problems)


def test_bad_type_and_invalid_json_in_one_span(dlrm_dir: Path):
    """A badly typed event and invalid JSON in the same decoded span (regression: msgspec.DecodeError
    escaped from the lenient path): salvaged, or a one-line TraceError."""
    doc = fresh_json(dlrm_dir / RANK7)
    x_events(doc)[10]["ts"] = []
    text = json.dumps(doc).encode()
    m, s = _boundary(text, 1600)
    pos = s + m.start() + 2
    expected = complete_events_in_prefix(text[:pos])      # the ts [] event counts as complete JSON
    bad = replace_rank7(dlrm_dir, text[:pos] + b" @@ " + text[pos:])
    try:
        trace, _ = read_kineto(bad)
    except TraceError:
        return
    assert trace.meta.salvaged and expected - 2 <= trace.meta.events_total <= expected
