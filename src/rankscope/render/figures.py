"""One name per figure: the per-rank and straggler figures of `analyze`, each with its terminal column
header, its key in `rankscope.analysis/1`, its HTML label and the one definition every output prints.

The terminal tables take their headers and captions from here, the HTML report its series names, table
headers and notes; tests/invariants.py checks that each name shows the figure its key holds.
"""
from __future__ import annotations

from dataclasses import dataclass

from rankscope.render.html_parts import CATEGORY_LABELS
from rankscope.results.stragglers import COST_DEFINITION


@dataclass(frozen=True)
class Figure:
    """One figure under its name in each output, and its definition."""
    terminal: str | None   # column header in the terminal ("\n": a two-line header); None: not in the terminal
    json: str | None       # key in the JSON entry (dots: nested keys); None: derived, not one key
    html: str | None       # label in the HTML report; None: not in the report
    definition: str

    def terminal_header(self) -> str:
        """`terminal`, of a figure the terminal shows (the caller knows it is one)."""
        assert self.terminal is not None, f"not in the terminal: {self.definition}"
        return self.terminal

    def json_key(self) -> str:
        """`json`, of a figure that is one key."""
        assert self.json is not None, f"not one JSON key: {self.definition}"
        return self.json

    def html_label(self) -> str:
        """`html`, of a figure the HTML report shows."""
        assert self.html is not None, f"not in the HTML report: {self.definition}"
        return self.html

    def legend(self) -> str:
        """'<terminal name>: <definition>', as a table caption lists it (of a figure the terminal shows)."""
        return f"{self.terminal_header().replace(chr(10), ' ')}: {self.definition}"


def _part(header: str, category: str, definition: str) -> Figure:
    return Figure(header, f"breakdown_ms.{category}", CATEGORY_LABELS[category], definition)


#: The step breakdown's columns (entries of `ranks[]`; mean ms per step).
BREAKDOWN = {
    "step": Figure("step", "step_time_ms.mean", None, "mean step time, ms"),
    "compute": _part("comp", "compute", "compute running, no comm"),
    "comm_overlapped": _part("c.ovl", "comm_overlapped", "comm overlapped with compute"),
    "comm_exposed": _part("c.exp", "comm_exposed", "comm exposed (no compute)"),
    "memcpy": _part("mcpy", "memcpy", "memcpy/memset only"),
    "dataloader": _part("data", "dataloader", "device idle, host in the DataLoader"),
    "sync": _part("sync", "sync", "device idle, host in a synchronize"),
    "host": _part("host", "host", "device idle, host in CPU ops/launches"),
    "idle_other": _part("idle", "idle_other", "device idle, host outside any op"),
    "overlap_efficiency": Figure("eff", "overlap_efficiency", "overlap efficiency",
                                 "overlap efficiency, 0-1: the time compute and comm both run over the shorter of "
                                 "the two, in the steps: comm overlapped / min(compute + comm overlapped, "
                                 "comm overlapped + comm exposed)"),
}

#: Communication per parallel dimension (`ranks[].comm_by_dim_ms.<dim>`, mean ms per step).
COMM_BY_DIM = {
    "overlapped": Figure("ovl", "overlapped", "overlapped", "that dimension's collectives running beside compute"),
    "exposed": Figure("exp", "exposed", "exposed", "running with no compute (for pp: waiting on pipeline neighbours)"),
}
COMM_BY_DIM_NOTE = ("each instant of communication counts once, for the collective that started first; "
                    "a rank's dimensions sum to its c.ovl + c.exp")

#: The pipeline's stages (`pipeline.stages[]`).
PIPELINE_STAGE = {
    "compute": Figure("compute ms", "compute_ms_per_step", "compute ms per step",
                      "compute running (alone or beside communication), mean ms per step of the stage's ranks"),
    "bubble_ms": Figure("bubble ms", "bubble_ms_per_step", "bubble ms per step",
                        "waiting on pipeline neighbours with nothing to compute (pp exposed communication), ms "
                        "per step"),
    "bubble_pct": Figure("bubble", "bubble_pct", "bubble % of step", "the bubble, % of the stage's step"),
}

#: The step-time table's columns (entries of `ranks[]`).
STEP_TIME = {
    "events": Figure("events", "events", None, "trace events read"),
    "steps": Figure("steps", None, None, "steps profiled on the rank"),
    "mean": Figure("mean ms", "step_time_ms.mean", None, "mean step time"),
    "median": Figure("median ms", "step_time_ms.median", None, "median step time"),
    "max": Figure("max ms", "step_time_ms.max", None, "longest step"),
    "gpu_busy": Figure("GPU busy", "gpu_busy_pct", None,
                       "device busy (any kernel, memcpy or memset), % of step time"),
}

#: The per-rank details (entries of `ranks[]`): HTA figures, data loading, precision, memory.
DETAILS = {
    "overlap_pct": Figure("c.ovl%", "overlap_pct", "comm overlapped by compute (HTA)",
                          "comm overlapped by compute, % of comm time: |comm ∩ compute| / |comm| over the "
                          "trace, less its last (cut-short) profiler step as in HTA"),
    "host_wait": Figure("host wait\nΣ streams", "idle_ms_summed_over_streams.host_wait",
                        "host wait, summed over streams",
                        "device idle waiting for the host to launch, ms summed over the rank's streams (HTA)"),
    "kernel_wait": Figure("kern wait\nΣ streams", "idle_ms_summed_over_streams.kernel_wait",
                          "kernel wait, summed over streams",
                          "device idle between kernels, < 30 µs gaps, ms summed over the rank's streams (HTA)"),
    "other_wait": Figure(None, "idle_ms_summed_over_streams.other", "other idle, summed over streams",
                         "device idle for another reason (e.g. waiting on another stream), ms summed over the "
                         "rank's streams (HTA)"),
    "streams": Figure("streams", "idle_streams", None,
                      "device streams summed over: each stream's idle time counts, so a sum can exceed the "
                      "time span"),
    "loader": Figure("loader%", "dataloader.share_pct", None,
                     "host in DataLoader.__next__, % of step time (device busy or not)"),
    "fp32": Figure("fp32", "kernels.stats.fp32_gemm_share_pct", None, "FP32 share of GEMM time"),
    "tensor_core": Figure("TC", "kernels.stats.tensor_core_pct", None, "Tensor Core share of kernel time"),
    "peak": Figure("peak MB", None, None, "peak allocated memory of the rank's GPU"),
}

#: The straggler figures (entries of `stragglers[]` and `rank_stats[]`).
STRAGGLER = {
    "cost": Figure("cost ms/step", "cost_ms_per_step", "cost ms/step", COST_DEFINITION.removeprefix("cost = ")),
    "last_arrival": Figure("last arrival %", "last_arrival_pct", "last arrival %",
                           "share of its collectives it arrived last at"),
    "wait_imposed": Figure("others' wait ms/step", "wait_imposed_ms_per_step", "others' wait ms/step",
                           "the other ranks' wait for it in collectives it arrived last at, median over them "
                           "(includes waits off their critical path: not its cost)"),
    "own_wait": Figure(None, "own_wait_ms_per_step", "own wait ms/step",
                       "its own wait for later ranks in collectives"),
    "step_time_z": Figure(None, "step_time_z", "step-time z",
                          "z-score of its mean step time against the ranks' means"),
}


def _gap(activity: str, doing: str) -> Figure:
    return Figure(None, f"idle_gaps.gap_ms_by_host_activity.{activity}", f"gaps, host {doing}",
                  f"device idle gaps inside steps while the host was {doing}, total ms")


#: The device idle gaps by the host's activity (entries of `ranks[]`).
GAPS = {"dataloader": _gap("dataloader", "in the DataLoader"), "sync": _gap("sync", "in a synchronize"),
        "host": _gap("host", "in CPU ops/launches"), "idle_other": _gap("idle_other", "outside any op")}

#: Every figure, by table: what the checker walks.
TABLES = {"step_time": STEP_TIME, "breakdown": BREAKDOWN, "details": DETAILS, "gaps": GAPS, "straggler": STRAGGLER}


def legend(figures: dict[str, Figure]) -> str:
    """The terminal caption of a table: each shown figure's name and definition."""
    return " · ".join(f.legend() for f in figures.values() if f.terminal)


def html_legend(*figures: Figure) -> str:
    """The HTML note under a chart or table: each figure's label and definition."""
    return "; ".join(f"{f.html}: {f.definition}" for f in figures) + "."
