"""Communication / computation overlap of one rank (docs/hta-parity.md).

Anchor: HTA 0.5 `TraceAnalysis.get_comm_comp_overlap` (hta/trace_analysis.py), implemented in
`CommunicationAnalysis.get_comm_comp_overlap` (hta/analyzers/communication_analysis.py).

Definition: overlap = |∪COMM ∩ ∪COMP| / |∪COMM|, the share of the time communication kernels run
during which computation kernels run too, with the kernel classes of docs/concepts.md. Rank level: over the
device events of the HTA scope (`temporal.hta_scope_mask`: like HTA, the last profiler step and device
events without a launch are left out unless `include_last_step`). Per step: the same ratio inside
each step window (`steps.step_windows`, docs/concepts.md "Step"), from all device events of the trace,
since a window already says which time counts.

Differs from HTA on purpose: HTA counts a kernel as communication only when its name matches
`^nccl.*Kernel`, so symmetric-memory collectives (`multimem_*`, `*cross_device_reduce*`) are
computation there, which turns communication time into "overlap" (docs/hta-parity.md, tracelens-b200).
A rank without communication has no ratio (None; HTA gives NaN).
"""
from __future__ import annotations

import numpy as np

from rankscope.analyses.intervals import covered_between, union
from rankscope.analyses.rank.steps import StepWindows, step_windows
from rankscope.analyses.rank.temporal import class_intervals, scope_device_rows
from rankscope.analyses.rank.views import rows_of_kinds
from rankscope.model import DEVICE_KINDS, KernelClass, RankTrace
from rankscope.units import NS_PER_MS
from rankscope.results.rank import StepOverlap, CommCompOverlap


def _overlap_in(comm: tuple[np.ndarray, np.ndarray], comp: tuple[np.ndarray, np.ndarray],
                both: tuple[np.ndarray, np.ndarray], a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per window [a, b): |COMM|, |COMP| and |COMM ∩ COMP| (inclusion-exclusion on the unions)."""
    c = covered_between(*comm, a, b)
    p = covered_between(*comp, a, b)
    u = covered_between(*both, a, b)
    return c, p, c + p - u


def _sets(trace: RankTrace, device_rows: np.ndarray) -> tuple[tuple, tuple, tuple]:
    """Unions of the COMM kernels, of the COMP kernels and of both, among these device events."""
    cs, ce = class_intervals(trace, device_rows, KernelClass.COMM)
    ps, pe = class_intervals(trace, device_rows, KernelClass.COMP)
    return union(cs, ce), union(ps, pe), union(np.concatenate([cs, ps]), np.concatenate([ce, pe]))


def comm_comp_overlap(trace: RankTrace, windows: StepWindows | None = None,
                      include_last_step: bool = False) -> CommCompOverlap:
    comm, comp, both = _sets(trace, scope_device_rows(trace, include_last_step))
    c, p, u = (int((e - s).sum()) for s, e in (comm, comp, both))
    o = c + p - u
    result = CommCompOverlap(overlap_pct=100.0 * o / c if c > 0 else None, comm_ms=c / NS_PER_MS,
                             overlapped_ms=o / NS_PER_MS, compute_ms=p / NS_PER_MS,
                             include_last_step=include_last_step)
    device_rows = rows_of_kinds(trace, DEVICE_KINDS)
    if len(device_rows) == 0:
        return result
    windows = windows if windows is not None else step_windows(trace)
    f = windows.frame
    if f.is_empty():
        return result
    comm, comp, both = _sets(trace, device_rows)
    a = f["start_ns"].to_numpy()
    b = f["end_ns"].to_numpy()
    wc, _, wo = _overlap_in(comm, comp, both, a, b)
    result.steps = [
        StepOverlap(step=int(s), comm_ms=float(x) / NS_PER_MS, overlapped_ms=float(y) / NS_PER_MS,
                    overlap_pct=100.0 * float(y) / float(x) if x > 0 else None)
        for s, x, y in zip(f["step"].to_list(), wc, wo)]
    result.steps_source = windows.source
    return result
