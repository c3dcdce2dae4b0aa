"""Synthetic whole runs: `generate_run` writes what a profiler schedule with `repeat` writes (one file per
rank per cycle, `rank<R>.<ts>.pt.trace.json[.gz]`), each cycle a `generate_job` of its own steps (numbered
as the profiler numbers them: `wait + warmup` unprofiled steps before each cycle's `steps`), later on one
clock; the faults start at `from_cycle`. Ranks keep their speed across cycles, each cycle draws its own
noise. `ground_truth.json` (schema rankscope.ground_truth.run/1) lists the cycles and the changes a correct
run analysis reports: for each fault that makes one rank a straggler, a slowdown of that rank from the
first step of `from_cycle`, its cause (the step breakdown category the fault's time lands in) and a
straggler onset; nothing for a healthy run."""
from __future__ import annotations

from pathlib import Path

import msgspec

from rankscope.files import atomic_write_bytes
from rankscope.synth.constants import FIRST_STEP, GENERATOR, GENERATOR_VERSION, GROUND_TRUTH_FILE
from rankscope.synth.faults import _STRAGGLER_CAUSE_BY_KIND, Injection, _makes_straggler, _normalized
from rankscope.synth.job import _TRACE_FILE, generate_job
from rankscope.synth.simulation import Cycle

RUN_TRUTH_SCHEMA = "rankscope.ground_truth.run/1"
#: The step breakdown category a straggler cause's time lands in on the late rank.
CAUSE_CATEGORY = {"host_idle": "idle_other", "dataloader": "dataloader", "gpu_compute": "compute",
                  "memcpy": "memcpy"}
#: Time between the end of one cycle's last step and the next cycle's start, on top of its unprofiled steps.
GAP_NS = 200_000_000


def generate_run(out_dir: str | Path, ranks: int = 8, cycles: int = 5, steps: int = 2, seed: int = 0,
                 injections: list[Injection] | None = None, from_cycle: int = 1, gzip: bool = True,
                 scale: float = 1.0, wait: int = 1, warmup: int = 1) -> dict:
    """Write `cycles` profiler cycles of `steps` profiled steps each into out_dir (trace files of an earlier
    run there are replaced) and ground_truth.json; return the ground truth."""
    if cycles < 1 or not 1 <= from_cycle <= cycles:
        raise ValueError(f"need cycles >= 1 and 1 <= from_cycle <= cycles; got cycles={cycles}, "
                         f"from_cycle={from_cycle}")
    injections = [_normalized(inj, ranks) for inj in injections or []]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if _TRACE_FILE.match(old.name):
            old.unlink()
    period = wait + warmup + steps
    rows, offset = [], 0
    for c in range(cycles):
        cycle = Cycle(index=c + 1, first_step=FIRST_STEP + c * period, offset_ns=offset)
        active = injections if c + 1 >= from_cycle else []
        truth = generate_job(out, ranks=ranks, steps=steps, seed=seed, injections=active, gzip=gzip, scale=scale,
                             cycle=cycle)
        rows.append({"cycle": c + 1, "steps": truth["steps"], "injected": bool(active),
                     "files": sorted(r["file"] for r in truth["expected"]["per_rank"].values())})
        longest = max(sum(r["step_time_ms"]) for r in truth["expected"]["per_rank"].values())
        offset += int(longest * 1e6 * period / steps) + GAP_NS
    first = rows[from_cycle - 1]["steps"][0]
    changes = []
    for inj in injections:
        if _makes_straggler(inj) and from_cycle > 1:
            cause = inj.params["cause"] if inj.kind == "straggler" else _STRAGGLER_CAUSE_BY_KIND[inj.kind]
            changes.append({"kind": "slowdown", "rank": inj.params["rank"], "cause": CAUSE_CATEGORY.get(cause),
                            "first_step": first, "first_cycle": from_cycle})
            changes.append({"kind": "straggler_onset", "rank": inj.params["rank"], "cause": cause,
                            "first_step": first, "first_cycle": from_cycle})
    run_truth = {"schema": RUN_TRUTH_SCHEMA, "generator": GENERATOR, "generator_version": GENERATOR_VERSION,
                 "random_seed": seed, "world_size": ranks, "profiler_schedule": {"wait": wait, "warmup": warmup,
                                                                                 "active": steps, "repeat": cycles},
                 "injections": [{"kind": i.kind, "params": i.params} for i in injections], "from_cycle": from_cycle,
                 "cycles": rows, "expected_changes": changes}
    atomic_write_bytes(out / GROUND_TRUTH_FILE, msgspec.json.format(msgspec.json.encode(run_truth), indent=1) + b"\n")
    return run_truth
