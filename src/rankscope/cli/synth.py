"""`rankscope synth`: a synthetic Kineto job with injected faults (`rankscope.synth`)."""
from __future__ import annotations

import sys

import click

from rankscope.cli.common import EXIT_NOTHING, err, say


@click.command("synth")
@click.argument("out", type=click.Path())
@click.option("--ranks", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=6, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--inject", "injections", multiple=True, metavar="KIND:key=value,...",
              help="A fault to inject, e.g. straggler:rank=3,cause=dataloader,delay_ms=40 (repeatable).")
@click.option("--scale", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Model size multiplier (events per step); 12 gives ~50 MB per rank.")
@click.option("--no-gzip", is_flag=True, help="Write .pt.trace.json instead of .pt.trace.json.gz.")
@click.option("--twin", type=click.Path(), default=None,
              help="Also write the job without its injections to this folder: the fault-free twin (the same "
                   "random draws), to check a what-if's prediction against.")
@click.option("--cycles", type=click.IntRange(min=1), default=1, show_default=True,
              help="Write a run of this many profiler cycles (one file per rank per cycle; --steps profiled steps "
                   "each), as schedule(wait=1, warmup=1, active=STEPS, repeat=CYCLES) writes it.")
@click.option("--from-cycle", "from_cycle", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --cycles: the injections start at this cycle (the run is healthy before it).")
@click.option("--layout", "layout", default=None, metavar="SPEC",
              help="Write a job of this parallel layout instead of the DDP job, e.g. "
                   "pp=4,dp=2,tp=2,schedule=1f1b,microbatches=8,names=mesh (keys and faults: "
                   "`rankscope synth --layout help`). --ranks, --inject and --scale do not apply; "
                   "--steps defaults to 3 there.")
def command(out, ranks, steps, seed, injections, scale, no_gzip, twin, cycles, from_cycle, layout) -> None:
    """Write a synthetic Kineto job (one trace per rank) and its ground_truth.json."""
    if layout is not None:
        _layout_job(out, layout, steps, seed, injections, no_gzip, twin)
        return
    if cycles > 1 or from_cycle > 1:
        _run(out, ranks, steps, seed, injections, scale, no_gzip, cycles, from_cycle)
        return
    from rankscope.synth import generate_job, parse_injection
    try:
        parsed = [parse_injection(text) for text in injections]
        truth = generate_job(out, ranks=ranks, steps=steps, seed=seed, injections=parsed, gzip=not no_gzip,
                             scale=scale)
        if twin:
            generate_job(twin, ranks=ranks, steps=steps, seed=seed, injections=[], gzip=not no_gzip, scale=scale)
    except (ValueError, NotImplementedError) as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        _cannot_write(exc)
    say(f"wrote {ranks} rank traces and ground_truth.json to {out} "
        f"({len(truth.get('injections', []))} injection(s))"
        + (f"; its fault-free twin to {twin}" if twin else ""))


def _layout_job(out, text, steps, seed, injections, no_gzip, twin) -> None:
    """`--layout SPEC`: rankscope.synth.layouts (a pipeline / data / expert / tensor parallel job)."""
    from rankscope.synth.layouts import LAYOUT_HELP, generate_layout_job, parse_layout
    if text.strip() in ("help", "?"):
        click.echo(LAYOUT_HELP)
        return
    if injections:
        raise click.UsageError("--inject does not apply to --layout jobs: give the faults in SPEC "
                               "(slow_stage=S, no_prefetch=1, exposed_tp=1, expert_skew=R; see --layout help)")
    ctx = click.get_current_context()
    layout_steps = steps if ctx.get_parameter_source("steps") == click.core.ParameterSource.COMMANDLINE else 3
    try:
        spec = parse_layout(text)
        truth = generate_layout_job(out, spec, steps=layout_steps, seed=seed, gzip=not no_gzip)
        if twin:
            generate_layout_job(twin, spec.healthy(), steps=layout_steps, seed=seed, gzip=not no_gzip)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        _cannot_write(exc)
    say(f"wrote {truth['world_size']} rank traces of {truth['spec']} and ground_truth.json to {out} "
        f"(faults: {', '.join(truth['faults']) or 'none'})"
        + (f"; its healthy twin to {twin}" if twin else ""))


def _cannot_write(exc: OSError) -> None:
    """One line (the file and why), exit 2."""
    err(f"cannot write {exc.filename}: {exc.strerror or exc}" if exc.filename else f"cannot write: {exc}")
    sys.exit(EXIT_NOTHING)


def _run(out, ranks, steps, seed, injections, scale, no_gzip, cycles, from_cycle) -> None:
    """`--cycles N`: rankscope.synth.runs (a run of several profiler cycles)."""
    from rankscope.synth import parse_injection
    from rankscope.synth.runs import generate_run
    try:
        truth = generate_run(out, ranks=ranks, cycles=cycles, steps=steps, seed=seed,
                             injections=[parse_injection(text) for text in injections], from_cycle=from_cycle,
                             gzip=not no_gzip, scale=scale)
    except (ValueError, NotImplementedError) as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        _cannot_write(exc)
    say(f"wrote {ranks} ranks x {cycles} cycles ({ranks * cycles} trace files) and ground_truth.json to "
        f"{out} ({len(truth['injections'])} injection(s) from cycle {from_cycle})")
