"""Command line: parse arguments, call the API, pick a renderer. Nothing is computed here.

Exit codes: 0 ok; 1 the analysis ran but some inputs were skipped (stderr says which);
2 nothing usable, or bad arguments.
"""
from __future__ import annotations

import gc
import sys
from pathlib import Path

import click
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rankscope import __version__
from rankscope.api import analyze, ingest
from rankscope.engine import ENGINES, EngineError
from rankscope.ingest.cache import default_cache_dir

EXIT_OK, EXIT_SKIPPED, EXIT_NOTHING = 0, 1, 2


def _print_json(obj) -> None:
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(obj), indent=1))
    sys.stdout.write("\n")


def _err(message: str) -> None:
    click.echo(f"rankscope: {message}", err=True)


def _with_progress(run, quiet: bool, label: str):
    """Call run(on_progress) with a progress bar on stderr (when it is a terminal); print every
    input problem on stderr, one line each."""
    stderr = Console(stderr=True)
    show = not quiet and stderr.is_terminal
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=stderr, transient=True, disable=not show) as bar:
        task = bar.add_task(label, total=None)

        def progress(done: int, total: int, _file: str) -> None:
            bar.update(task, completed=done, total=total)

        try:
            result = run(progress)
        except EngineError as exc:
            _err(str(exc))
            sys.exit(EXIT_NOTHING)
    for p in result.problems:
        _err(str(p) if p.fatal else f"warning: {p}")
    return result


def _exit_code(result) -> int:
    if not result.ranks:
        _err("no usable trace found" + ("" if result.problems else " (give a folder of *.pt.trace.json[.gz] files)"))
        return EXIT_NOTHING
    return EXIT_SKIPPED if result.skipped else EXIT_OK


_common = [
    click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                 help=f"Where parsed ranks are kept (default {default_cache_dir()}; env RANKSCOPE_CACHE_DIR)."),
    click.option("--no-cache", is_flag=True, help="Parse every file; neither read nor write the cache."),
    click.option("--engine", type=click.Choice(ENGINES), default="auto", show_default=True,
                 help="Per-rank work: local thread pool, worker processes, one by one in this process, "
                      "Ray tasks (pip install 'rankscope[ray]'), or auto by input size."),
    click.option("--address", default=None, metavar="ADDR",
                 help="Ray cluster to run on (implies --engine ray): 'auto', 'HOST:6379' or 'ray://HOST:10001'. "
                      "Without it, --engine ray starts a local Ray runtime of --workers CPUs."),
    click.option("--workers", type=click.IntRange(min=1), default=None,
                 help="Parallel ranks for the local/processes engines, CPUs of a local Ray runtime "
                      "(default: usable CPU cores)."),
    click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema rankscope.analysis/1)."),
    click.option("-q", "--quiet", is_flag=True, help="No progress bar."),
]


def common_options(f):
    for opt in reversed(_common):
        f = opt(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rankscope")
def main() -> None:
    """rankscope: where every millisecond of every step went on every rank."""
    # The objects of the imports (numpy, polars: ~10^5) live as long as the process: out of the
    # cyclic collector's sight, its full passes during a parse no longer walk them all.
    gc.freeze()


@main.command("analyze")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--demo", is_flag=True, help="Analyse a generated demo job (8 ranks, one straggler).")
@click.option("--threshold", "thresholds", multiple=True, metavar="NAME=VALUE",
              help="Override a finding threshold (repeatable); `rankscope thresholds` lists them.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Also write a self-contained HTML report (findings and charts, works offline) to PATH.")
@click.option("--nccl-log", "nccl_logs", multiple=True, type=click.Path(), metavar="LOG",
              help="An NCCL_DEBUG=INFO log of the job (repeatable; several = runs to compare): its findings join.")
@common_options
def analyze_cmd(paths, demo, thresholds, cache_dir, no_cache, engine, address, workers, as_json, quiet,
                html_path, nccl_logs) -> None:
    """Analyse a job: a folder of per-rank traces (or files)."""
    if demo:
        from rankscope.synth import demo_job_dir
        paths = (str(demo_job_dir(Path(cache_dir) if cache_dir else default_cache_dir())),) + tuple(paths)
    if not paths:
        raise click.UsageError("give a folder of traces (or files), or --demo")
    from rankscope.findings import parse_threshold, resolve_thresholds
    try:
        overrides = dict(parse_threshold(t) for t in thresholds)
        resolve_thresholds(overrides)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    result = _with_progress(lambda progress: analyze(list(paths), cache_dir=cache_dir, use_cache=not no_cache,
                                                     engine=engine, workers=workers, on_progress=progress,
                                                     address=address, thresholds=overrides,
                                                     nccl_logs=list(nccl_logs)),
                            quiet, "analysing ranks")
    code = _exit_code(result)
    if result.ranks:
        from rankscope.render.json import analysis_to_dict
        report = analysis_to_dict(result) if as_json or html_path else None     # one dict for both
        if as_json:
            _print_json(report)
        else:
            from rankscope.render.terminal import render_analysis
            render_analysis(result, Console(highlight=False), brief=quiet)
        if html_path:
            _write_html(report, html_path)
    sys.exit(code)


def _write_html(report: dict, path: str) -> None:
    from rankscope.render.html import render_html
    try:
        Path(path).write_text(render_html(report), encoding="utf-8")
    except OSError as exc:
        _err(f"cannot write the HTML report {path}: {exc.strerror or exc}")
        sys.exit(EXIT_NOTHING)
    click.echo(f"wrote HTML report to {path}", err=True)


@main.command("validate")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@common_options
def validate_cmd(paths, cache_dir, no_cache, engine, address, workers, as_json, quiet) -> None:
    """Check trace files before sharing them: rank, format, events, steps, problems per file."""
    result = _with_progress(lambda progress: ingest(list(paths), cache_dir=cache_dir, use_cache=not no_cache,
                                                    engine=engine, workers=workers, on_progress=progress,
                                                    address=address),
                            quiet, "reading ranks")
    from rankscope.render.validate import render_validation, validation_rows
    rows = validation_rows(result)
    if as_json:
        _print_json({"schema": "rankscope.validate/1", "files": rows, "job_warnings": result.warnings})
    else:
        render_validation(rows, result.warnings, Console(highlight=False))
    sys.exit(_exit_code(result))


@main.command("synth")
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--ranks", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=6, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--inject", "injections", multiple=True, metavar="KIND:key=value,...",
              help="A fault to inject, e.g. straggler:rank=3,cause=dataloader,delay_ms=40 (repeatable).")
@click.option("--scale", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Model size multiplier (events per step); 12 gives ~50 MB per rank.")
@click.option("--no-gzip", is_flag=True, help="Write .pt.trace.json instead of .pt.trace.json.gz.")
def synth_cmd(out, ranks, steps, seed, injections, scale, no_gzip) -> None:
    """Write a synthetic Kineto job (one trace per rank) and its ground_truth.json."""
    from rankscope.synth import generate_job, parse_injection
    try:
        parsed = [parse_injection(text) for text in injections]
        truth = generate_job(out, ranks=ranks, steps=steps, seed=seed, injections=parsed, gzip=not no_gzip,
                             scale=scale)
    except (ValueError, NotImplementedError) as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"wrote {ranks} rank traces and ground_truth.json to {out} "
               f"({len(truth.get('injections', []))} injection(s))")


@main.command("thresholds")
@click.option("--json", "as_json", is_flag=True, help="Print them as one JSON object.")
def thresholds_cmd(as_json) -> None:
    """List the findings' thresholds: name, default value, unit and source (override with
    `analyze --threshold NAME=VALUE`)."""
    from rankscope.findings import THRESHOLDS
    if as_json:
        _print_json({name: {"value": t.value, "unit": t.unit, "source": t.source} for name, t in THRESHOLDS.items()})
        return
    from rankscope.render.terminal import render_thresholds
    render_thresholds(THRESHOLDS, Console(highlight=False))


# ---- export: other tools' formats ------------------------------------------------------------
@main.group("export")
def export_group() -> None:
    """Write a job in another tool's format."""


@export_group.command("perfetto")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="The file to write: Chrome-trace JSON, gzipped when the name ends in .gz (job.json.gz).")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help=f"Where parsed ranks are kept (default {default_cache_dir()}; env RANKSCOPE_CACHE_DIR).")
@click.option("--no-cache", is_flag=True,
              help="Use no cache: a scratch one lives for this export only (each file is parsed once).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def export_perfetto_cmd(paths, out, cache_dir, no_cache, quiet) -> None:
    """All ranks in one timeline for ui.perfetto.dev / chrome://tracing: clocks aligned, one process
    per rank, with overlay tracks (idle gaps, exposed communication, straggler waits, steps) and
    counters (launch queue, memcpy bandwidth, allocated memory)."""
    from rankscope.api import export_perfetto
    try:
        result = _with_progress(lambda progress: export_perfetto(list(paths), out, cache_dir=cache_dir,
                                                                 use_cache=not no_cache, on_progress=progress),
                                quiet, "exporting ranks")
    except OSError as exc:
        _err(f"{out}: cannot write: {exc.strerror or exc}")
        sys.exit(EXIT_NOTHING)
    code = _exit_code(result)
    if result.ranks:
        click.echo(f"wrote {len(result.ranks)} ranks, {result.events} events to {out} "
                   f"({result.size_bytes / 1e6:.1f} MB); open it in https://ui.perfetto.dev")
    sys.exit(code)


@main.command("diff")
@click.argument("before", type=click.Path(exists=True))
@click.argument("after", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema rankscope.diff/1).")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help=f"Where parsed ranks are kept (default {default_cache_dir()}; env RANKSCOPE_CACHE_DIR).")
@click.option("--no-cache", is_flag=True, help="Parse every file; neither read nor write the cache.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Also write the comparison as a self-contained HTML page to PATH.")
def diff_cmd(before, after, as_json, cache_dir, no_cache, quiet, html_path) -> None:
    """A/B comparison of two runs (trace folders or single traces): what changed, beyond noise."""
    from rankscope.analyses.job.diff import diff_analyses
    sides = []
    for path in (before, after):
        result = _with_progress(lambda progress, path=path: analyze([path], cache_dir=cache_dir, use_cache=not no_cache,
                                                                    on_progress=progress),
                                quiet, f"analysing {Path(path).name}")
        if not result.ranks:
            _err(f"{path}: no usable trace found (give a folder of *.pt.trace.json[.gz] files, or one file)")
            sys.exit(EXIT_NOTHING)
        sides.append(result)
    d = diff_analyses(*sides, labels=(before, after))
    from rankscope.render.diff_json import diff_to_dict
    if html_path:
        from rankscope.render.diff_html import render_diff_html
        try:
            Path(html_path).write_text(render_diff_html(diff_to_dict(d)), encoding="utf-8")
        except OSError as exc:
            _err(f"{html_path}: cannot write the HTML page: {exc.strerror or exc}")
            sys.exit(EXIT_NOTHING)
    if as_json:
        _print_json(diff_to_dict(d))
    else:
        from rankscope.render.diff_terminal import render_diff
        render_diff(d, Console(highlight=False))
    sys.exit(EXIT_SKIPPED if any(side.skipped for side in sides) else EXIT_OK)


# ---- other inputs: NCCL debug logs, CUDA memory snapshots -----------------------------------
def _read_inputs(paths, reader) -> tuple[list, list[dict]]:
    """Each path through `reader`; an unusable file is one stderr line and a `skipped` entry."""
    from rankscope.ingest import TraceError
    parsed, skipped = [], []
    for path in paths:
        try:
            parsed.append(reader(path))
        except TraceError as exc:
            _err(f"{path}: {exc}")
            skipped.append({"file": str(path), "problem": str(exc)})
    return parsed, skipped


def _inputs_exit_code(parsed: list, skipped: list) -> int:
    return EXIT_NOTHING if not parsed else EXIT_SKIPPED if skipped else EXIT_OK


@main.command("nccl")
@click.argument("logs", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema rankscope.nccl/1).")
def nccl_cmd(logs, as_json) -> None:
    """NCCL_DEBUG=INFO logs (each one run, e.g. healthy vs slow): version, ranks, channels, rings and trees,
    transport per peer, NCCL's link bandwidths, nccl-tests bus bandwidth; what is slower than its peers."""
    from rankscope.analyses.inputs.nccl import compare_nccl_logs
    from rankscope.findings import nccl_findings
    from rankscope.ingest.nccl_log import read_nccl_log
    parsed, skipped = _read_inputs(logs, read_nccl_log)
    if parsed:
        report = compare_nccl_logs(parsed)
        findings = nccl_findings(report)
        if as_json:
            from rankscope.render.nccl import nccl_to_dict
            _print_json(nccl_to_dict(report, findings, skipped))
        else:
            from rankscope.render.nccl import render_nccl
            render_nccl(report, findings, Console(highlight=False))
    sys.exit(_inputs_exit_code(parsed, skipped))


@main.command("memory")
@click.argument("snapshots", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema rankscope.memory_snapshot/1).")
@click.option("--params", type=click.IntRange(min=1), default=None, metavar="N",
              help="Model parameters: adds the theoretical breakdown (params + grads + Adam states + activations).")
@click.option("--param-bytes", type=click.IntRange(min=1), default=4, show_default=True,
              help="Bytes per parameter and gradient (2 for bf16/fp16: an fp32 master copy is then counted).")
def memory_cmd(snapshots, as_json, params, param_bytes) -> None:
    """CUDA memory snapshots (torch.cuda.memory._dump_snapshot pickles, read without running any code):
    peak, fragmentation, largest live blocks and their stacks, the events before an OOM, memory by category."""
    from rankscope.analyses.inputs.memory_snapshot import analyze_snapshot
    from rankscope.ingest.memory_snapshot import read_memory_snapshot
    parsed, skipped = _read_inputs(snapshots, read_memory_snapshot)
    reports = [analyze_snapshot(s, params=params, param_bytes=param_bytes) for s in parsed]
    if as_json and parsed:
        from rankscope.render.memory_snapshot import memory_to_dict
        _print_json(memory_to_dict(reports, skipped))
    elif parsed:
        from rankscope.render.memory_snapshot import render_memory
        render_memory(reports, Console(highlight=False))
    sys.exit(_inputs_exit_code(parsed, skipped))


# ---- mfu: model / hardware FLOPs utilization ---------------------------------------------------
_DIMS = ("layers", "hidden", "heads", "vocab", "seq", "batch")


@main.command("mfu")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--model-flops-per-step", type=click.FloatRange(min=0, min_open=True), default=None, metavar="F",
              help="Model FLOPs of one training step of the whole job (all GPUs).")
@click.option("--layers", type=click.IntRange(min=1), default=None, help="Transformer layers.")
@click.option("--hidden", type=click.IntRange(min=1), default=None, help="Hidden size.")
@click.option("--heads", type=click.IntRange(min=1), default=None, help="Attention heads.")
@click.option("--vocab", type=click.IntRange(min=1), default=None, help="Vocabulary size.")
@click.option("--seq", type=click.IntRange(min=1), default=None, help="Sequence length.")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Global batch per step, in sequences.")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="none", show_default=True,
              help="Activation recomputation (HFU counts the recomputed FLOPs).")
@click.option("--dtype", type=click.Choice(["fp8", "bf16", "fp16", "tf32", "fp32"]), default=None,
              help="Peak FLOPs dtype (default: the GEMMs' dtype recorded in the traces, else bf16).")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help=f"Where parsed ranks are kept (default {default_cache_dir()}; env RANKSCOPE_CACHE_DIR).")
@click.option("--no-cache", is_flag=True, help="Parse every file; neither read nor write the cache.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema rankscope.mfu/1).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def mfu_cmd(paths, model_flops_per_step, recompute, dtype, cache_dir, no_cache, as_json, quiet, **dims) -> None:
    """Model and hardware FLOPs utilization (MFU / HFU) against the devices' peak, and communication
    efficiency (bus bandwidth / link peak). FLOPs come from the model (--model-flops-per-step, or the
    transformer dims) or from the traces (with_flops=True per-op FLOPs, else recorded GEMM shapes)."""
    from rankscope.analyses.job.mfu import from_summary, given_flops, mfu_report, transformer_flops
    from rankscope.analyses.rank.summary import as_plain
    given = [d for d in _DIMS if dims[d] is not None]
    try:
        if given and (len(given) < len(_DIMS) or model_flops_per_step):
            raise ValueError("give all of --layers --hidden --heads --vocab --seq --batch, or --model-flops-per-step")
        model = (transformer_flops(*(dims[d] for d in _DIMS), recompute=recompute) if given else
                 given_flops(model_flops_per_step, recompute) if model_flops_per_step else None)
        if model is None:
            given_flops(1.0, recompute)      # selective recompute needs the model dims
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    result = _with_progress(lambda progress: analyze(list(paths), cache_dir=cache_dir, use_cache=not no_cache,
                                                     on_progress=progress), quiet, "analysing ranks")
    code = _exit_code(result)
    if not result.ranks:
        sys.exit(code)
    ranks = [from_summary(s, traced=model is None) for s in result.ranks]
    by_type = as_plain(result.cross.as_dict())["collectives"]["by_type"] if result.cross else []
    report = mfu_report(ranks, result.job.world_size, model, dtype, recompute, by_type, len(result.job.hosts))
    if as_json:
        from rankscope.render.mfu import mfu_to_dict
        _print_json(mfu_to_dict(report))
    else:
        from rankscope.render.mfu import render_mfu
        render_mfu(report, Console(highlight=False))
    sys.exit(code)



def _calibrate_sizes(_ctx, _param, value):
    from rankscope.capture.calibrate import parse_sizes
    try:
        return parse_sizes(value) if value else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@main.command("calibrate")
@click.option("--sizes", callback=_calibrate_sizes, default=None, metavar="S,S,...",
              help="Message sizes in bytes, nccl-tests' S (K/M/G = KiB/MiB/GiB); default 1K,4K,...,64M.")
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True, help="Timed calls per size.")
@click.option("--ops", default="all_reduce,all_gather,reduce_scatter", show_default=True, metavar="OP,OP,...",
              help="Collectives to time.")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=None,
              help="Process group backend (default: nccl when CUDA is available, else gloo).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema rankscope.calibrate/1).")
def calibrate_cmd(sizes, iters, ops, backend, as_json) -> None:
    """Measure collective latency (alpha) and bandwidth (beta) across message sizes on this job's
    fabric. Run it under torchrun: torchrun --nproc-per-node 4 --no-python rankscope calibrate."""
    from rankscope.capture._torch import CaptureError
    from rankscope.capture.calibrate import DEFAULT_SIZES, calibrate_under_torchrun, format_table
    try:
        doc = calibrate_under_torchrun(sizes or DEFAULT_SIZES, iters, tuple(ops.split(",")), backend)
    except (CaptureError, ValueError) as exc:
        _err(str(exc))
        sys.exit(EXIT_NOTHING)
    if doc is None:                  # ranks other than 0 print nothing
        return
    if as_json:
        _print_json(doc)
    else:
        click.echo("\n".join(format_table(doc)))

if __name__ == "__main__":  # pragma: no cover
    main()
