"""Every value that decides a verdict, in one registry: the findings' tiers and the straggler and
load-balance verdicts of the cross-rank analysis. Each has a unit, the source it comes from and
what it decides; `rankscope thresholds` lists them and `analyze --threshold NAME=VALUE` overrides
any of them.

`resolve(overrides)` checks the overrides once and returns the `Thresholds` in force; analyses and
findings receive that object and read values by name.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Threshold:
    value: float
    unit: str
    source: str
    decides: str          # the finding id whose verdict it decides, or one of VERDICTS
    #: The values an override may take, both included (declared where the unit does not say them:
    #: `allowed`; set for every threshold of THRESHOLDS).
    limits: tuple[float, float] | None = None


#: Ranges by unit: a percent (or percentage points) 0-100, a percent over or above a mean 0-10,000, a
#: share 0-1, a count of ranks or rounds a whole number up to 2^20; anything else (ratios, sigmas,
#: sizes, times) from 0, finite.
_COUNT_UNITS = ("ranks", "rounds")
_MAX_COUNT = float(1 << 20)


def allowed(t: Threshold) -> tuple[float, float]:
    """The values an override of `t` may take (both included)."""
    if t.limits is not None:
        return t.limits
    if t.unit.startswith(("% over", "% above")):
        return 0.0, 10_000.0
    if t.unit.startswith(("%", "percentage points")):
        return 0.0, 100.0
    if t.unit.startswith("share"):
        return 0.0, 1.0
    if t.unit in _COUNT_UNITS:
        return 0.0, _MAX_COUNT
    return 0.0, math.inf


def checked(name: str, value: float) -> float:
    """`value` as an override of threshold `name`; ValueError (one line) where it is not a finite number
    in the threshold's range (a whole number for a count): NaN, for one, compares false with every
    value, and would silently turn a verdict off."""
    t = THRESHOLDS[name]
    lo, hi = allowed(t)                 # (THRESHOLDS' own `limits`)
    value = float(value)
    whole = t.unit not in _COUNT_UNITS or value.is_integer()
    if not (math.isfinite(value) and lo <= value <= hi and whole):
        what = "a whole number" if t.unit in _COUNT_UNITS else "a finite number"
        span = f"from {_shown(lo)} to {_shown(hi)}" if hi < math.inf else f"of at least {_shown(lo)}"
        raise ValueError(f"threshold {name}={value:g} refused: {what} {span} ({t.unit}) is expected")
    return value


def _shown(x: float) -> str:
    return f"{x:,.0f}" if x.is_integer() else f"{x:g}"


_TB = "TensorBoard profiler plugin (torch-tb-profiler) recommendation"
_OURS = "rankscope default, checked on the corpus cpu-gloo-4rank sets (healthy: no high finding)"
_TIERS = f"rankscope default: tiers above the {_TB}, DataLoader > 5-20% of step"
_OUTLIER = ("rankscope default: the usual outlier rule, a rank's mean step time > 2 sigma or > 10% over the mean "
            "(docs/concepts.md, Straggler)")

#: Verdicts a threshold may decide besides the findings': the critical path's owner and what-ifs.
VERDICTS = ("critical_path", "severity")

THRESHOLDS: dict[str, Threshold] = {
    # DataLoader: share of the step the device (or training thread) waits inside DataLoader.__next__
    "dataloader_low_pct": Threshold(5.0, "% of step", f"{_TB}: DataLoader > 5% of step", "dataloader_stall"),
    "dataloader_medium_pct": Threshold(10.0, "% of step", _TIERS, "dataloader_stall"),
    "dataloader_high_pct": Threshold(20.0, "% of step", _TIERS, "dataloader_stall"),
    # communication that no computation hides (waits for late ranks excluded)
    "exposed_comm_low_pct": Threshold(5.0, "% of step", _OURS, "exposed_communication"),
    "exposed_comm_medium_pct": Threshold(10.0, "% of step", _OURS, "exposed_communication"),
    "exposed_comm_high_pct": Threshold(60.0, "% of step", _OURS, "exposed_communication"),
    # gradient collectives launched after backward ended (analyses/rank/grad_sync.py)
    "after_backward_pct": Threshold(50.0, "% of gradient collectives", "PyTorch DDP design: buckets all-reduce "
                                    "during backward; most launched after it means no overlap", "low_overlap"),
    "low_overlap_pct": Threshold(30.0, "% of comm time overlapped (HTA)", _OURS, "low_overlap"),
    "comm_significant_pct": Threshold(10.0, "% of step", _OURS, "low_overlap"),
    "comm_bound_ratio": Threshold(1.2, "comm time / compute time", "rankscope default: with more communication than "
                                  "compute, no overlap hides it all; 1.2x leaves room for measurement noise",
                                  "comm_bound"),
    # device idle while the host runs CPU ops / launches
    "host_bound_medium_pct": Threshold(15.0, "% of step", _OURS, "gpu_idle_host_bound"),
    "host_bound_high_pct": Threshold(30.0, "% of step", _OURS, "gpu_idle_host_bound"),
    "short_kernel_share_pct": Threshold(60.0, "% of launches shorter than the runtime cutoff",
                                        "HTA kernel launch statistics (runtime_cutoff 50 us)", "launch_overhead"),
    "launch_idle_pct": Threshold(20.0, "% of step device idle (host + other)", _OURS, "launch_overhead"),
    # a device idle almost all the time, whatever the host did meanwhile (warm-up, compilation, a host loop)
    "gpu_busy_low_pct": Threshold(10.0, "% of step the device is busy (below: idle almost all the time)",
                                  "rankscope default: a training step keeps its device busy most of the time; "
                                  "below a tenth the device waits on the host whatever the cause",
                                  "gpu_idle_host_bound"),
    # kernels generated by a compiler (TorchInductor's Triton, nvFuser): the model is compiled already
    "generated_kernel_share_pct": Threshold(50.0, "% of kernel time (or launches) in compiler-generated kernels",
                                            "rankscope default: most of the kernels come from a compiler, so "
                                            "torch.compile is on already and is not advised",
                                            "launch_overhead"),
    "sync_medium_pct": Threshold(5.0, "% of step", _OURS, "sync_stall"),
    "sync_high_pct": Threshold(15.0, "% of step", _OURS, "sync_stall"),
    "pageable_memcpy_low_pct": Threshold(1.0, "% of step", _OURS, "unpinned_memcpy"),
    "pageable_memcpy_medium_pct": Threshold(5.0, "% of step", _OURS, "unpinned_memcpy"),
    "gemm_share_pct": Threshold(10.0, "% of kernel time in GEMMs", _OURS, "tensor_cores_unused"),
    "fp32_gemm_pct": Threshold(50.0, "% of GEMM time without Tensor Cores", _OURS, "tensor_cores_unused"),
    "gemm_share_high_pct": Threshold(30.0, "% of kernel time in GEMMs (FP32 GEMMs high from here)",
                                     "rankscope default: 3x gemm_share_pct", "tensor_cores_unused"),
    "fragmentation_pct": Threshold(30.0, "% of reserved not allocated at peak", _OURS, "memory_fragmentation"),
    "fragmentation_min_mb": Threshold(512.0, "MB", _OURS, "memory_fragmentation"),
    "memory_pressure_medium_pct": Threshold(80.0, "% of device capacity", _OURS, "memory_pressure"),
    "memory_pressure_high_pct": Threshold(90.0, "% of device capacity", _OURS, "memory_pressure"),
    "busbw_low_pct_of_peak": Threshold(25.0, "% of the device's link peak", "nccl-tests bus bandwidth",
                                       "low_bus_bandwidth"),
    "busbw_min_bytes": Threshold(1 << 20, "bytes per collective (below: latency bound)", "nccl-tests",
                                 "low_bus_bandwidth"),
    "straggler_high_cost_pct": Threshold(10.0, "% of median step", _OURS, "straggler_rank"),
    # NCCL debug logs compared as runs (analyses/inputs/nccl.py)
    "nccl_busbw_pct_of_best": Threshold(70.0, "% of the best run's nccl-tests bus bandwidth at the same sizes",
                                        "rankscope default; nccl-tests run-to-run spread is a few %",
                                        "low_bus_bandwidth"),
    "nccl_busbw_high_pct_of_best": Threshold(50.0, "% of the best run's nccl-tests bus bandwidth (below: high)",
                                             "rankscope default: half the best run's bandwidth",
                                             "low_bus_bandwidth"),
    "nccl_degraded_pct_of_peers": Threshold(75.0, "% of the best peer's channel count / NCCL link bandwidth",
                                            "rankscope default; checked on the corpus nccl-logs-2xA100 (healthy: none)",
                                            "degraded_nccl_link"),
    "nccl_degraded_high_pct_of_peers": Threshold(50.0, "% of the best peer's channel count / NCCL link bandwidth "
                                                 "(below: high)", "rankscope default: half of what its peers have",
                                                 "degraded_nccl_link"),
    # the straggler verdict of the cross-rank analysis (analyses/job/stragglers.py)
    "straggler_step_z": Threshold(2.0, "standard deviations of the ranks' mean step times", _OUTLIER,
                                  "straggler_rank"),
    "straggler_step_pct": Threshold(10.0, "% over the ranks' mean step time", _OUTLIER, "straggler_rank"),
    "straggler_last_share_min": Threshold(0.5, "share of its collectives (or of the job's last-arrival lateness)",
                                          "rankscope default: last at least half of the time", "straggler_rank"),
    "straggler_last_share_chance_factor": Threshold(
        1.5, "x the share chance gives (1 / ranks)",
        "rankscope default: at least 1.5x the share chance gives; with 2 ranks that is 75%", "straggler_rank"),
    "straggler_min_cost_pct_of_step": Threshold(
        5.0, "% of the median step",
        "straggler_step_pct's '10% over the mean', halved because cost is measured directly (not through noisy step "
        "times). Measured: the closest candidate of a healthy or launch-bound synthetic job (rank speed spread "
        "1-2%, rankscope.synth) costs <= 1.4%, cpu-gloo-4rank-loader0's 2.1%, param-dlrm-8rank's rank 7 5.0% "
        "(0.80 ms: it starts the one profiled step late), cpu-gloo-4rank-straggler's 40 ms sleep 57%",
        "straggler_rank"),
    "straggler_min_cost_ms": Threshold(0.05, "ms per step",
                                       "rankscope default: a floor under straggler_min_cost_pct_of_step",
                                       "straggler_rank"),
    "straggler_candidates": Threshold(
        3, "ranks", "rankscope default: the what-if (cost, cause) runs for the ranks over the last-share bar and "
        "for this many ranks that were last most often, so a healthy job's report still shows its closest "
        "candidate", "straggler_rank"),
    "straggler_max_rounds": Threshold(
        3, "rounds", "rankscope default: after each round the stragglers found are taken out and the rest "
        "re-matched, so a smaller straggler hidden behind a bigger one is found too", "straggler_rank"),
    "straggler_min_ranks_next_round": Threshold(
        4, "ranks", "rankscope default: with fewer, 'the median of the others' is one or two ranks "
        "(cpu-gloo-4rank-loader2 would name a second rank out of its three left on 2 ms)", "straggler_rank"),
    "straggler_queued_gap_us": Threshold(
        10.0, "us after the end of the rank's previous collective (arrival queued behind it)",
        "kernels of one stream start back to back (param-dlrm-8rank: 1-2 us apart)", "straggler_rank"),
    "straggler_cause_min_share": Threshold(
        0.5, "share of the rank's positive excess (or of its lateness, for a late step start)",
        "rankscope default: a cause must explain at least half, else the cause is 'unknown'", "straggler_rank"),
    # the load-balance verdict (analyses/job/stragglers.py)
    "load_all_idle_pct": Threshold(20.0, "% of a step every rank idles at once",
                                   "rankscope default; corpus: cpu-gloo-4rank-loader0 (num_workers=0 everywhere) "
                                   "55%, cpu-gloo-4rank-healthy 8.6%", "load_imbalance"),
    "load_wait_imbalance_pct": Threshold(10.0, "% of the median step (median minus least exposed communication)",
                                         "rankscope default", "load_imbalance"),
    # parallel layouts: pipeline, sharded data parallel, tensor parallel, expert parallel
    "pipeline_stage_imbalance_pct": Threshold(
        20.0, "% of the stages' mean compute per step", "rankscope default", "pipeline_stage_imbalance",
        (0.0, 10_000.0)),
    "pipeline_stage_imbalance_high_pct": Threshold(
        50.0, "% of the stages' mean compute per step", "rankscope default", "pipeline_stage_imbalance",
        (0.0, 10_000.0)),
    "pipeline_bubble_excess_pct": Threshold(
        10.0, "percentage points of step over (p-1)/(m+p-1)",
        "rankscope default over the 1F1B / GPipe bubble of Narayanan et al. 2021", "pipeline_bubble"),
    "pipeline_bubble_large_pct": Threshold(
        20.0, "% of step the stages wait on their neighbours (mean stage), at theory or not",
        "rankscope default: a fifth of every step idle is worth more microbatches or an interleaved schedule",
        "pipeline_bubble"),
    "pipeline_bubble_high_excess_pct": Threshold(
        25.0, "percentage points of step over (p-1)/(m+p-1)", "rankscope default", "pipeline_bubble"),
    "fsdp_exposed_gather_pct": Threshold(5.0, "% of step", "rankscope default", "fsdp_exposed_gather"),
    "fsdp_exposed_gather_high_pct": Threshold(20.0, "% of step", "rankscope default", "fsdp_exposed_gather"),
    "tp_comm_exposed_pct": Threshold(5.0, "% of step", "rankscope default", "tp_comm_exposed"),
    "tp_comm_exposed_high_pct": Threshold(20.0, "% of step", "rankscope default", "tp_comm_exposed"),
    "expert_imbalance_pct": Threshold(25.0, "% above the expert-parallel group's mean tokens (bytes) per rank",
                                      "rankscope default", "expert_imbalance"),
    # critical path
    "critical_path_owner_pct": Threshold(50.0, "% of the critical path on one rank", "rankscope default",
                                         "critical_path"),
    "critical_path_what_if_min_pct": Threshold(5.0, "% of the step on the critical path (a rank's time in one "
                                                     "category, to re-time without it)", "rankscope default",
                                               "critical_path"),
    # severity by cost: the same bands for every finding whose fix the what-if re-times
    "saving_high_pct": Threshold(25.0, "% of the job's median step the fix saves (what-if)",
                                 "rankscope default: a quarter of every step is worth fixing first (the corpus cpu-gloo-4rank-healthy job: 24% of exposed communication, its most, is medium)", "severity"),
    "saving_medium_pct": Threshold(5.0, "% of the job's median step the fix saves (what-if)",
                                   "rankscope default: below this, within the noise of step times", "severity"),
    "expert_imbalance_high_pct": Threshold(100.0, "% above the expert-parallel group's mean tokens (bytes) per rank",
                                           "rankscope default", "expert_imbalance"),
    # whole runs: changes over the profiler cycles (analyses/run/changes.py)
    "run_change_false_alarm_pct": Threshold(1.0, "% chance of a false change in a healthy run (nominal: normal, "
                                            "independent steps; sets the critical z)", "rankscope default; the "
                                            "measured rate is in docs/runs.md", "slowdown_onset"),
    "run_change_min_pct": Threshold(10.0, "% of the step before the change (smaller moves are not reported)",
                                    "rankscope default", "slowdown_onset"),
    "run_change_min_steps": Threshold(2.0, "profiled steps on each side of a change (fewer: an outlier)",
                                      "rankscope default", "slowdown_onset"),
    "slowdown_onset_high_pct": Threshold(25.0, "% of the step before the slowdown", "rankscope default",
                                         "slowdown_onset"),
}

THRESHOLDS = {name: replace(t, limits=allowed(t)) for name, t in THRESHOLDS.items()}


class Thresholds(Mapping[str, float]):
    """The values in force (defaults with the overrides applied), read by name; read-only."""

    def __init__(self, values: Mapping[str, float]):
        self._values = dict(values)

    def __getitem__(self, name: str) -> float:
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(f"threshold {name!r} is not among {sorted(self._values)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        changed = {k: v for k, v in self._values.items() if k in THRESHOLDS and v != THRESHOLDS[k].value}
        return f"Thresholds(overridden={changed})"

    def only(self, names: Iterable[str]) -> Thresholds:
        """These values alone, in the order of `names` (what one rule may read)."""
        return Thresholds({name: self[name] for name in names})


def resolve(overrides: Mapping[str, float] | None = None) -> Thresholds:
    """The thresholds in force; an unknown name raises ValueError listing the known ones. An already
    resolved `Thresholds` is returned as it is."""
    if isinstance(overrides, Thresholds):
        return overrides
    values = {name: t.value for name, t in THRESHOLDS.items()}
    for name, value in (overrides or {}).items():
        if name not in values:
            raise ValueError(f"unknown threshold {name!r}; known: {', '.join(sorted(values))}")
        values[name] = checked(name, value)
    return Thresholds(values)


def parse_override(text: str) -> tuple[str, float]:
    """`NAME=VALUE` from the command line."""
    name, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return name.strip(), float(value)
    except ValueError:
        raise ValueError(f"threshold {text!r}: write NAME=NUMBER, e.g. dataloader_high_pct=30") from None
