"""Clock alignment across ranks from collective end times.

Ranks on different hosts read different clocks: a rank whose clock is ahead by d shows every event
d later. Members of one collective finish together (a NCCL ring/tree all-reduce completes on every
rank within microseconds of the last transfer: param-dlrm-8rank's kernels end within 1-3 µs of each
other), while their starts differ by the very skew we want to measure. So the ends are the
reference:

  d[r, c] = end[r, c] - median over members of collective c of (end - offset)
  offset[r] = median over c of d[r, c]          (iterated, so partial groups chain together)

then anchored on the median clock of the ranks (robust to any one rank being off, rank 0 included).
`offset_ns[r]` is what to SUBTRACT from rank r's timestamps to put it on that common clock.
Uncertainty: the standard error of a median, 1.2533 x sigma / sqrt(n), with sigma estimated
robustly as 1.4826 x MAD of the residuals d[r, c] - offset[r].

Only symmetric collectives are used (`SYMMETRIC_TYPES`: every member ends with the last transfer);
when fewer than `MIN_MATCHED_COLLECTIVES` of those are matched on a rank, every matched collective
type is used. A rank with fewer matched collectives than that keeps its raw timestamps (offset 0,
`applied` False) and the result says so. An offset is applied only when it exceeds
`APPLY_SIGMAS` x its uncertainty (and `MIN_APPLIED_OFFSET_NS`): ranks on one host share a clock,
and correcting them by noise would only blur the arrival order.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import polars as pl

from rankscope.results.collectives import Collectives
from rankscope.analyses.job.matching import matched_rows, member_frame
from rankscope.numbers import rank_list
from rankscope.results.clock import ClockAlignment, ClockMethod, RankClock
from rankscope.units import NS_PER_MS

#: Collective types whose members all finish with the last transfer (ends coincide).
SYMMETRIC_TYPES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
#: Matched collectives a rank needs before its offset is trusted. 5 medians of µs-spread ends give
#: a µs-level estimate on NCCL; below that one outlier can move the median.
MIN_MATCHED_COLLECTIVES = 5
#: Apply an offset only when it is this many standard errors away from zero (a 4-sigma rule: on a
#: job whose ranks share one clock, the chance that noise alone gets applied is ~1e-4 per rank).
APPLY_SIGMAS = 4.0
#: ... and at least this large: below a microsecond nothing we report changes.
MIN_APPLIED_OFFSET_NS = 1_000
_ITERATIONS = 6


def applied_offsets(clock: ClockAlignment) -> dict[int, int]:
    """rank -> ns to subtract (only the offsets that are applied; others 0). The offsets are whole ns,
    which their ms value gives back exactly (|offset| < 2**52 ns)."""
    return {r.rank: (round(r.offset_ms * NS_PER_MS) if r.applied else 0) for r in clock.ranks}


def _alignment(ranks: list[int], offset_ns: list[int], uncertainty_ns: list[int], used: list[int],
               applied: list[bool], method: ClockMethod, note: str) -> ClockAlignment:
    return ClockAlignment(method=method, note=note, ranks=[
        RankClock(rank=r, offset_ms=o / NS_PER_MS, uncertainty_ms=u / NS_PER_MS if u >= 0 else None,
                  collectives_used=n, applied=a)
        for r, o, u, n, a in zip(ranks, offset_ns, uncertainty_ns, used, applied)])


def estimate_clock_offsets(ranks: Sequence[Collectives], members: pl.DataFrame | None = None,
                           min_collectives: int = MIN_MATCHED_COLLECTIVES) -> ClockAlignment:
    """Estimate every rank's clock offset from matched collective end times (module docstring)."""
    all_ranks = sorted({rc.rank for rc in ranks})
    m = members if members is not None else member_frame(ranks)
    if m.is_empty() or len(all_ranks) < 2:
        return raw_clocks(all_ranks, "fewer than two ranks with collectives: timestamps used as recorded")
    # numpy on the few columns read (not polars filters and joins on the whole member frame: at 256
    # ranks x 336 instances those left ~25 MB with polars' allocator); the row order of E does not
    # matter (medians per collective, then per rank)
    key = m["key"].to_numpy()
    matched = matched_rows(m)
    rank = m["rank"].to_numpy()
    sym = matched & m["type"].is_in(SYMMETRIC_TYPES).to_numpy()
    per_rank_sym = np.unique(rank[sym], return_counts=True)[1]
    if not len(per_rank_sym) or per_rank_sym.min() < min_collectives:
        sym = matched                             # too few symmetric ones: use every matched type
    if not sym.any():
        return raw_clocks(all_ranks, "no collective is matched across ranks by sequence or order (pipeline sends and "
                               "recvs, paired by time, cannot set clocks): timestamps used as recorded")

    # dense arrays: collective index x rank index
    ci = np.unique(key[sym], return_inverse=True)[1].reshape(-1)
    ri = np.searchsorted(np.asarray(all_ranks, dtype=np.int64), rank[sym])
    end = m["end_ns"].to_numpy()[sym].astype(np.float64)
    n_c, n_r = int(ci.max()) + 1, len(all_ranks)
    E = np.full((n_c, n_r), np.nan)
    E[ci, ri] = end
    # work relative to each collective's first member end to keep float64 exact at ns scale
    base = np.nanmin(E, axis=1, keepdims=True)
    E = E - base
    used = np.sum(~np.isnan(E), axis=0)
    offset = np.zeros(n_r)
    for _ in range(_ITERATIONS):
        ref = np.nanmedian(E - offset[None, :], axis=1, keepdims=True)
        d = E - ref
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)      # ranks without a matched collective
            new = np.where(used > 0, np.nanmedian(np.where(np.isnan(d), np.nan, d), axis=0), 0.0)
        new = np.nan_to_num(new)
        if np.allclose(new, offset, atol=0.5):
            offset = new
            break
        offset = new
    ref = np.nanmedian(E - offset[None, :], axis=1, keepdims=True)
    resid = E - ref - offset[None, :]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mad = np.nanmedian(np.abs(resid), axis=0)
    sigma = 1.4826 * np.nan_to_num(mad)
    stderr = 1.2533 * sigma / np.sqrt(np.maximum(used, 1))

    enough = used >= min_collectives
    if not enough.any():
        return raw_clocks(all_ranks, f"fewer than {min_collectives} matched collectives per rank: timestamps used "
                               f"as recorded", used=used.tolist())
    # anchor: the median clock of the ranks with evidence (robust to any one rank being off,
    # rank 0 included); the uncertainty is each rank's own standard error against it
    offset = offset - np.median(offset[enough])
    unc = stderr
    off_ns = np.rint(offset).astype(np.int64)
    unc_ns = np.ceil(unc).astype(np.int64)
    applied = enough & (np.abs(off_ns) >= np.maximum(APPLY_SIGMAS * unc_ns, MIN_APPLIED_OFFSET_NS))
    off_ns = np.where(enough, off_ns, 0)
    unc_ns = np.where(enough, unc_ns, -1)
    few = [all_ranks[i] for i in np.flatnonzero(~enough)]
    shifted = [all_ranks[i] for i in np.flatnonzero(applied)]
    parts = [f"offsets from {int(np.median(used[enough]))} matched collective ends per rank, relative to the "
             f"median clock of the ranks"]
    if shifted:
        parts.append("applied to rank(s) " + rank_list(shifted))
    else:
        parts.append("none significant: timestamps used as recorded")
    if few:
        parts.append(f"rank(s) {', '.join(map(str, few))}: fewer than {min_collectives} matched collectives, raw timestamps")
    return _alignment(all_ranks, off_ns.tolist(), unc_ns.tolist(), used.astype(int).tolist(), applied.tolist(),
                      "collective_end", "; ".join(parts))


def raw_clocks(ranks: list[int], note: str, used: list[int] | None = None) -> ClockAlignment:
    """Every rank on its own timestamps (no offset estimated), and why (`note`)."""
    return _alignment(list(ranks), [0] * len(ranks), [-1] * len(ranks), used or [0] * len(ranks),
                      [False] * len(ranks), "raw", note)
