"""The cross-rank critical path of every step and what-if re-timing (docs/concepts.md "Critical path").

A reduce over the ranks' `RankCollectives` (small per-rank summaries: each collective's arrival and
end, the step-breakdown of the window before each arrival (`pre_ns`), of each step's tail) and the
matched collectives (`CollectiveTable`), on the aligned clock. No event frames: it holds at 256+
ranks.

**The dependency graph of a step.** On each rank, the step is a chain: work before a collective
(its pre window: [the end of the collective that ended last before the arrival, or the step start;
the arrival)), the collective, the next window, ..., the tail (the end of its last collective ->
the step end). Across ranks, a collective ends only after its last member arrives (every member's
end = the last arrival + that member's transfer time); a recv ends after its matching send
started (pipeline send/recv pairs: matching.py, p2p.py).

**The path** is walked back from the end of the rank with the longest step (the job's step: every
other rank's step fits in it): through its tail to the
end of its last collective; there, if another member arrived last, the path goes to that member at
its arrival (the transfer after it stays on the first rank), else through the collective to the
rank's own arrival; then through the pre window to the previous collective's end, and so on, until
the step start of the rank the walk began on. The segments tile that step exactly (a rank whose
step started later contributes the gap as `idle_other`). Inside a window the categories are laid out
in breakdown order (the window's exact total per category, not their order in time).

**What-if** re-times the graph (not a subtraction): every arrival is the end of what it depends on
plus its (changed) pre window; every collective ends at its members' latest (changed) arrival plus
its transfer (the compute that ran beside it after that scales with its rank's compute); a rank's
step ends at its last collective plus its (changed) tail. The job's step is the longest rank's step
(end - start; the ranks' starts kept); saved = the re-timed step with no change minus with the
change, mean over steps, never negative and never more than the path holds of what the change
removes (`_what_ifs`). Re-timed with no change the graph gives the measured steps back: the replay
error says how far it does. Changes (`WHAT_IF_KEYS`): a straggler's cause (or a category a rank on
the path spends more on than the median rank) at the median rank's level; a category removed on
every rank (DataLoader, host_idle, host, sync); communication overlapped (one dimension, FSDP's
parameter all-gathers, all of it: each collective then takes only the wait for its last member and
the compute beside it); for a pipeline with a known schedule and microbatch count, the pipeline
rebuilt and list-scheduled (pipeline_schedule.py) with its stages balanced, twice the
microbatches, or two model chunks per rank (without a schedule: balancing re-times the measured
graph, each stage's compute scaled to the stages' mean).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from rankscope.analyses.job.matching import CollectiveTable
from rankscope.analyses.job.pipeline_schedule import PipelineModel, makespan, theory_saving_ms
from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.analyses.rank.collectives import breakdown_matrix, instances, owned_ns, pre_matrix
from rankscope.thresholds import Thresholds, resolve
from rankscope.units import NS_PER_MS
from rankscope.results.collectives import Collectives
from rankscope.results.critical_path import CriticalPath, Lane, RankCategory, Segment, StepPath, Swimlane, WhatIf
from rankscope.results.pipeline import Pipeline

try:
    from rankscope.analyses import _retime as _c_retime      # the re-timing pass in C
except ImportError:                                            # built without a C compiler: `_StepPlan.retime`'s loop
    _c_retime = None  # type: ignore[assignment]  # no C module: None (its stub types the built one)

_N = len(CATEGORIES)
_IDLE = CATEGORIES.index("idle_other")
_EXPOSED = CATEGORIES.index("comm_exposed")
_OVERLAPPED = CATEGORIES.index("comm_overlapped")
_COMPUTE = (CATEGORIES.index("compute"), CATEGORIES.index("comm_overlapped"))
#: The path's name for idle_other: the straggler vocabulary's host_idle.
PATH_CATEGORY = {c: ("host_idle" if c == "idle_other" else c) for c in CATEGORIES}


class _Rank:
    """One rank's instances on the aligned clock, and its steps."""

    def __init__(self, rc: Collectives, offset_ns: int):
        n = instances(rc)
        self.rank = rc.rank
        self.a = np.asarray(rc.start_ns, dtype=np.int64)[:n] - offset_ns
        self.e = np.asarray(rc.end_ns, dtype=np.int64)[:n] - offset_ns
        self.w = (np.asarray(rc.window_start_ns, dtype=np.int64) - offset_ns) if len(rc.window_start_ns) == n \
            else self.a.copy()
        self.step = np.asarray(rc.step, dtype=np.int64)
        self.pre = pre_matrix(rc) if n else np.zeros((0, _N), np.int64)
        self.type = list(rc.type)
        self.dim = list(rc.dim) if len(rc.dim) == n else [""] * n
        ovl, exp = owned_ns(rc)
        self.comm_cat = np.where(ovl > exp, CATEGORIES.index("comm_overlapped"), CATEGORIES.index("comm_exposed"))
        self.steps = {int(s): (int(a) - offset_ns, int(b) - offset_ns)
                      for s, a, b in zip(rc.steps, rc.step_start_ns, rc.step_end_ns)}
        tails = np.asarray(rc.step_tail_ns, dtype=np.int64).reshape(-1, _N) if len(rc.step_tail_ns) else \
            np.zeros((0, _N), np.int64)
        self.tail = {int(s): tails[k] for k, s in enumerate(rc.steps) if k < len(tails)}
        self.by_step: dict[int, list[int]] = {}
        for i in np.argsort(self.a, kind="stable"):
            self.by_step.setdefault(int(self.step[i]), []).append(int(i))
        bd = breakdown_matrix(rc)
        self.mean_ns = bd.mean(axis=0) if len(bd) else np.zeros(_N)      # per category, mean per step
        self.compute_ns = float(self.mean_ns[list(_COMPUTE)].sum())
        self.cpu_only = rc.source == "host"
        self.ovl = np.asarray(owned_ns(rc)[0], dtype=np.int64)
        # per instance, the instance with the latest end <= its window start (ties: the last in end
        # order), -1 where none: what its window waited for
        order = np.argsort(self.e, kind="stable")
        k = np.searchsorted(self.e[order], self.w, side="right") - 1
        self.before_window = np.where(k >= 0, order[np.maximum(k, 0)], -1).tolist()

    def waited_for(self, i: int) -> int | None:
        """The instance whose end instance i's window started after (`before_window`), or None."""
        j = self.before_window[i]
        return j if j >= 0 else None

    def name(self, i: int) -> str:
        return self.type[i] + (f" ({self.dim[i]})" if self.dim[i] else "")

    def overlap_keys(self, i: int) -> tuple[str, ...]:
        """The overlap what-ifs (`overlap:<key>`) that free instance i: its dimension, its dimension
        and type, and every communication ("*"); none for pipeline send/recv."""
        d = self.dim[i]
        return () if d == "pp" else (d, f"{d}:{self.type[i]}", "*")


def critical_path(ranks: Sequence[Collectives], table: CollectiveTable, pipeline: Pipeline | None,
                  thresholds: Thresholds | None = None, stragglers: Sequence[tuple[int, str]] = (),
                  causes: dict[str, tuple[str, ...]] | None = None) -> CriticalPath | None:
    """The critical path of every step the ranks share, its attribution and the what-ifs (module
    docstring); None without steps. `stragglers`: (rank, cause) of the ranks the straggler verdict
    names, each given the what-if of its cause at the median rank's level; `causes`: the causes'
    breakdown categories (stragglers.CAUSE_GROUPS; None: no what-if at the median rank's level)."""
    t = resolve(thresholds)
    offsets = table.offsets_ns
    rk = {rc.rank: _Rank(rc, int(offsets.get(rc.rank, 0))) for rc in ranks if rc.steps}
    if not rk:
        return None
    links = _links(table, rk)
    steps = sorted(set.intersection(*(set(r.steps) for r in rk.values())))
    out = CriticalPath()
    exposed: dict[str, float] = {}            # exposed communication on the path, ms per overlap key
    for s in steps:
        walked = _walk(s, rk, links)
        if walked is not None:
            out.steps.append(walked[0])
            for k, v in walked[1].items():
                exposed[k] = exposed.get(k, 0.0) + v
    if not out.steps:
        return None
    out.step_ms = float(np.mean([p.duration_ms for p in out.steps]))
    totals: dict[tuple[int, str], float] = {}
    for p in out.steps:
        for sg in p.segments:
            totals[(sg.rank, sg.category)] = totals.get((sg.rank, sg.category), 0.0) + sg.dur_ms
    n = len(out.steps)
    out.by_rank_category = sorted(
        (RankCategory(r, PATH_CATEGORY[c], round(ms / n, 3),
                      round(100.0 * ms / n / out.step_ms, 2) if out.step_ms else 0.0)
         for (r, c), ms in totals.items() if ms > 0), key=lambda x: -x.ms_per_step)
    per_rank: dict[int, float] = {}
    for (r, _), ms in totals.items():
        per_rank[r] = per_rank.get(r, 0.0) + ms
    if per_rank and out.step_ms > 0:
        top = max(per_rank, key=lambda r: (per_rank[r], -r))
        out.owner_pct = round(min(100.0, 100.0 * per_rank[top] / n / out.step_ms), 2)
        out.owner = top if out.owner_pct >= t["critical_path_owner_pct"] and len(rk) > 1 else None
    exposed = {k: v / n for k, v in exposed.items()}
    out.what_if = _what_ifs(out, rk, links, steps, pipeline, t, exposed, stragglers, causes or {})
    by_duration = sorted(out.steps, key=lambda p: p.duration_ms)
    picks = [(by_duration[-1], "slowest step")]
    if len(by_duration) > 1:
        picks.append((by_duration[(len(by_duration) - 1) // 2], "median step"))
    named = [r for r, _ in stragglers]
    out.swimlanes = [_swimlane(p, label, rk, links, named) for p, label in picks]
    return out


#: Lanes a swimlane draws: the ranks on its step's path, the stragglers, then their collectives' peers.
MAX_LANES = 24


def _swimlane(path: StepPath, label: str, rk: dict[int, _Rank], links: _Links, named: Sequence[int]) -> Swimlane:
    """The lanes of step `path.step`: the ranks on its path (in the order the path visits them), the
    stragglers, then the peers of their collectives in that step (lowest rank first), at most
    `MAX_LANES`: at 4,096 ranks a lane per rank would hide the ranks that matter."""
    s = path.step
    end_rank = max(rk.values(), key=lambda r: (r.steps[s][1] - r.steps[s][0], -r.rank))
    t0 = end_rank.steps[s][0]
    ms = lambda v: round((int(v) - t0) / NS_PER_MS, 4)
    out = Swimlane(s, label)
    keep = list(dict.fromkeys([sg.rank for sg in path.segments] + [r for r in named if r in rk]))
    peers = sorted({q for r in keep for i in rk[r].by_step.get(s, []) if (r, i) in links.of
                    for q, _ in links.members[links.of[(r, i)]]} - set(keep))
    keep = (keep + peers)[:MAX_LANES]
    for r in (rk[q] for q in keep):
        a, b = r.steps[s]
        lane = Lane(r.rank, ms(a), ms(b))
        for i in r.by_step.get(s, []):
            cid = links.of.get((r.rank, i))
            last = max(links.last_arrival[cid], int(r.a[i])) if cid is not None else int(r.a[i])
            lane.collectives.append([ms(r.a[i]), ms(min(last, int(r.e[i]))), ms(r.e[i])])
            lane.names.append(r.name(i))
        out.lanes.append(lane)
    return out


# ------------------------------------------------------------------------------------------ links
@dataclass
class _Links:
    """Which instances complete together: (rank, idx) -> link id; per link its members, the last
    arrival (aligned) and the member that arrived last."""
    of: dict[tuple[int, int], int]
    members: dict[int, list[tuple[int, int]]]
    last_arrival: dict[int, int]
    last_member: dict[int, tuple[int, int]]


def _links(table: CollectiveTable, rk: dict[int, _Rank]) -> _Links:
    of: dict[tuple[int, int], int] = {}
    members: dict[int, list[tuple[int, int]]] = {}
    m = table.members
    if m.height:
        for cid, rank, idx in zip(*(m[c].to_list() for c in ("cid", "rank", "idx"))):
            if rank in rk:
                of[(rank, idx)] = cid
                members.setdefault(cid, []).append((rank, idx))
    last_arrival, last_member = {}, {}
    for cid, mem in members.items():
        best = max(mem, key=lambda k: (rk[k[0]].a[k[1]], -k[0]))
        last_member[cid] = best
        last_arrival[cid] = int(rk[best[0]].a[best[1]])
    return _Links(of, members, last_arrival, last_member)


# ------------------------------------------------------------------------------------------- walk
def _walk(s: int, rk: dict[int, _Rank], links: _Links) -> tuple[StepPath, dict[str, float]] | None:
    """Step s's path, and the exposed communication on it (ms) per overlap key (`overlap_keys`)."""
    end_rank = max(rk.values(), key=lambda r: (r.steps[s][1] - r.steps[s][0], -r.rank))
    t0, t_end = end_rank.steps[s]
    if t_end <= t0:
        return None
    raw: list[tuple] = []     # (rank, category, start, end, name[, overlap keys]), backwards

    def window(r: _Rank, a: int, b: int, vec: np.ndarray, name: str) -> None:
        if b <= a:
            return
        vec = vec.tolist()
        total = sum(vec)
        scale = (b - a) / total if total > 0 else 0.0
        cursor = a
        parts = [(c, int(round(v * scale))) for c, v in enumerate(vec) if v > 0] if total > 0 else [(_IDLE, b - a)]
        for k, (c, d) in enumerate(parts):
            stop = b if k == len(parts) - 1 else min(b, cursor + d)
            if stop > cursor:
                raw.append((r.rank, c, cursor, stop, name))
            cursor = stop

    cur, tt = end_rank, t_end
    idx = _last_in_step(cur, s)
    start = cur.steps[s][0]
    if idx is None:
        window(cur, start, tt, cur.tail.get(s, np.zeros(_N, np.int64)), "step without collectives")
        tt = start
    else:
        last_end = min(max(int(cur.e[idx]), start), tt)
        window(cur, last_end, tt, cur.tail.get(s, np.zeros(_N, np.int64)), "after its last collective")
        tt = last_end
        state = ("end", idx)
        for _ in range(16 * sum(len(r.a) for r in rk.values()) + 16):
            kind, i = state
            if kind == "end":
                cid = links.of.get((cur.rank, i))
                a_i, e_i = int(cur.a[i]), min(int(cur.e[i]), tt)
                if e_i < tt:          # its next window started after it ended (the rank's own time between)
                    window(cur, e_i, tt, np.zeros(_N, np.int64), f"after {cur.name(i)}")
                    tt = e_i
                if cid is not None and links.last_member[cid][0] != cur.rank and a_i < links.last_arrival[cid] < e_i:
                    la = links.last_arrival[cid]
                    raw.append((cur.rank, int(cur.comm_cat[i]), la, e_i, cur.name(i), cur.overlap_keys(i)))
                    q, k = links.last_member[cid]
                    cur, tt, state = rk[q], la, ("arrival", k)
                    continue
                if e_i > a_i:
                    raw.append((cur.rank, int(cur.comm_cat[i]), a_i, e_i, cur.name(i), cur.overlap_keys(i)))
                tt = min(tt, a_i)
                state = ("arrival", i)
            else:
                a_i, w_i = min(int(cur.a[i]), tt), int(cur.w[i])
                window(cur, w_i, a_i, cur.pre[i], f"before {cur.name(i)}")
                tt = min(tt, w_i)
                step_start = cur.steps.get(s, (t0, t0))[0]
                if tt <= max(step_start, t0):
                    break
                j = cur.waited_for(i)
                if j is None or j == i:
                    break
                state = ("end", j)
    if tt > t0:
        raw.append((cur.rank, _IDLE, t0, tt, "before its step started"))
    segments = []
    exposed: dict[str, float] = {}
    for rank, c, a, b, name, *keys in sorted(raw, key=lambda x: (x[2], x[3])):
        a, b = max(a, t0), min(b, t_end)
        if b > a:
            segments.append(Segment(rank, CATEGORIES[c], name, round((a - t0) / NS_PER_MS, 6),
                                    round((b - a) / NS_PER_MS, 6)))
            if c == _EXPOSED:
                for k in (keys[0] if keys else ()):
                    exposed[k] = exposed.get(k, 0.0) + (b - a) / NS_PER_MS
    return StepPath(s, round((t_end - t0) / NS_PER_MS, 6), segments, int(t0)), exposed


def path_slices(cp: CriticalPath | None, rank: int) -> list[tuple[int, int, str, str, int]]:
    """The path's segments on one rank, as (start ns on the aligned clock, duration ns, category,
    name, step): its critical-path track in a timeline export."""
    if cp is None:
        return []
    return [(p.start_ns + round(sg.start_ms * NS_PER_MS), round(sg.dur_ms * NS_PER_MS), sg.category, sg.name, p.step)
            for p in cp.steps for sg in p.segments if sg.rank == rank]


def _last_in_step(r: _Rank, s: int) -> int | None:
    idx = r.by_step.get(s) or []
    return max(idx, key=lambda i: (r.e[i], i)) if idx else None


# ---------------------------------------------------------------------------------------- what-if
class _Instances:
    """Every rank's instances numbered as one (rank by rank in `rk` order) and sorted once by (step,
    arrival, rank, idx), with what a step's plan reads of them: the plans of all steps then take
    their instances and links as slices of arrays instead of one lookup per instance. Each rank's
    own arrays (a, e, w, step, pre) become views of the joined ones, so they are held once."""

    def __init__(self, rk: dict[int, _Rank], links: _Links):
        ranks = list(rk.values())
        sizes = [len(r.a) for r in ranks]
        first = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
        # instance numbers, rank rows and codes as int32: at 256 ranks the job has ~100,000 instances
        self.row = np.repeat(np.arange(len(ranks), dtype=np.int32), sizes)
        joined = lambda arrays: np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        self.a, self.e = joined([r.a for r in ranks]), joined([r.e for r in ranks])
        self.w, self.step = joined([r.w for r in ranks]), joined([r.step for r in ranks])
        self.ovl = joined([r.ovl for r in ranks])           # per instance: the compute beside it (ns)
        self.pre = np.concatenate([r.pre for r in ranks]) if ranks else np.zeros((0, _N), np.int64)
        for r, lo, hi in zip(ranks, first[:-1], first[1:]):
            r.a, r.e, r.w = self.a[lo:hi], self.e[lo:hi], self.w[lo:hi]
            r.step, r.pre = self.step[lo:hi], self.pre[lo:hi]
        waited = joined([np.asarray(r.before_window, dtype=np.int64) for r in ranks])
        self.waited = np.where(waited >= 0, waited + first[:-1][self.row], -1).astype(np.int32)  # in this numbering
        self.dims = sorted({d for r in ranks for d in r.dim})
        code = {d: k for k, d in enumerate(self.dims)}
        self.dim = np.array([code[d] for r in ranks for d in r.dim], dtype=np.int32)
        self.types = sorted({t for r in ranks for t in r.type})
        code = {t: k for k, t in enumerate(self.types)}
        self.type = np.array([code[t] for r in ranks for t in r.type], dtype=np.int32)
        rank_ids = np.array(list(rk), dtype=np.int64)
        self.order = np.lexsort((np.arange(len(self.a)), rank_ids[self.row], self.a, self.step)).astype(np.int32)
        self.sorted_step = self.step[self.order]
        # links: each instance's link id (-1: none); per link id its members (`members[start:start +
        # count]`, in `links.members` order) and its last arrival
        by_rank = np.argsort(rank_ids)

        def numbered(pairs: list[tuple[int, int]]) -> np.ndarray:
            """(rank, idx) pairs -> numbers here."""
            p = np.array(pairs, dtype=np.int64).reshape(-1, 2)
            return first[by_rank[np.searchsorted(rank_ids, p[:, 0], sorter=by_rank)]] + p[:, 1]

        n_links = max(links.members) + 1 if links.members else 0
        self.link = np.full(len(self.a), -1, dtype=np.int32)
        self.link[numbered(list(links.of))] = list(links.of.values())
        # (one entry more than links: the last one, read at link id -1, stands for none)
        self.member_start = np.zeros(n_links + 1, dtype=np.int64)
        self.member_count = np.zeros(n_links + 1, dtype=np.int64)
        self.last_arrival = np.zeros(n_links + 1, dtype=np.int64)
        cids = list(links.members)
        self.member_count[cids] = [len(m) for m in links.members.values()]
        self.member_start[cids] = np.cumsum(self.member_count[cids]) - self.member_count[cids]
        self.last_arrival[cids] = [links.last_arrival[c] for c in cids]
        self.members = numbered([m for mem in links.members.values() for m in mem]).astype(np.int32)
        self.position = np.full(len(self.a), -1, dtype=np.int32)      # scratch: an instance's number in a step

    def of_step(self, s: int) -> np.ndarray:
        """The instances of step s in arrival order (ties: rank, idx)."""
        lo, hi = np.searchsorted(self.sorted_step, [s, s + 1])
        return self.order[lo:hi]


class _StepPlan:
    """What re-timing step s needs that no change alters, taken once and re-timed per what-if:
    the instances in arrival order, what each one's window started after (the end of an earlier
    instance of the step: `dep`; else a fixed time, the step start or a time in an earlier step:
    `fixed`), its pre-arrival window per category, its link, and per rank the last instance and
    the tail. Instances are numbered by arrival and re-timed in that order; a link member outside
    the step is number n, which never arrives. `instances`: `_Instances(rk, links)`, made once
    for every step."""

    def __init__(self, s: int, rk: dict[int, _Rank], links: _Links, instances: _Instances | None = None):
        x = instances if instances is not None else _Instances(rk, links)
        self.ranks = list(rk)
        g = x.of_step(s)
        n = len(g)
        position = x.position
        position[g] = np.arange(n)
        self.rank_row = x.row[g]
        self.pre = x.pre[g]
        self.arrival = x.a[g].astype(np.float64)
        self.duration = (x.e[g] - x.a[g]).astype(np.float64)
        self.dims, self.dim = x.dims, x.dim[g]
        self.types, self.type = x.types, x.type[g]
        # what each window started after: an earlier instance of the step on its rank, else its step
        # start, or (the instance it waited for ended in an earlier step) its own start
        step_start = np.array([r.steps[s][0] for r in rk.values()], dtype=np.int64)
        start, w, dep = step_start[self.rank_row], x.w[g], x.waited[g]
        waits = (w > start) & (dep >= 0) & (dep != g)
        same_step = waits & (x.step[np.maximum(dep, 0)] == s)
        self.dep = np.where(same_step, position[np.maximum(dep, 0)], -1).astype(np.int64)
        self.fixed = np.where(same_step, 0, np.where(waits, np.maximum(w, start), start)).astype(np.float64)
        # links, numbered in the order of their first instance here; each one's members listed once
        cid = x.link[g]
        linked = cid >= 0
        ids, first_at = np.unique(cid[linked], return_index=True)
        ids = ids[np.argsort(first_at, kind="stable")]
        number = np.full(len(x.member_start), -1, dtype=np.int64)
        number[ids] = np.arange(len(ids))
        self.link = number[cid]
        count = x.member_count[ids]
        self.offsets = np.concatenate(([0], np.cumsum(count, dtype=np.int64)))
        members = x.members[np.repeat(x.member_start[ids] - self.offsets[:-1], count) + np.arange(self.offsets[-1])]
        self.members = np.where(position[members] >= 0, position[members], n).astype(np.int64)
        last_of_link = np.maximum.reduceat(self.members, self.offsets[:-1]) if len(ids) else np.zeros(0, np.int64)
        self.last_member = np.append(last_of_link, n)[self.link]          # link -1: n
        self.transfer = np.where(linked, np.maximum(x.e[g] - x.last_arrival[cid], 0), 0).astype(np.float64)
        # the compute that ran beside it after its last member arrived (at most its transfer): an
        # overlapped collective still takes that long
        self.beside = np.minimum(self.transfer, x.ovl[g].astype(np.float64))
        # per rank (row): its last instance of the step (latest end, ties: highest idx; -1: none), its
        # step start, its tail per category
        self.last = np.full(len(rk), -1, dtype=np.int64)
        if n:
            by_row = np.lexsort((g, x.e[g], self.rank_row))
            rows = self.rank_row[by_row]
            ends = np.flatnonzero(np.r_[rows[1:] != rows[:-1], True])
            self.last[rows[ends]] = by_row[ends]
        self.start = step_start.astype(np.float64)
        self.tail = np.array([r.tail.get(s, np.zeros(_N)) for r in rk.values()], dtype=np.float64).reshape(-1, _N)
        position[g] = -1

    def free(self, keys: frozenset) -> np.ndarray:
        """Per instance: is it overlapped under the overlap keys `keys` (`_Rank.overlap_keys`: a
        dimension, "dimension:type", or "*" for every dimension but pp)."""
        dims = [k for k, d in enumerate(self.dims) if d in keys or ("*" in keys and d != "pp")]
        mask = np.isin(self.dim, dims)
        for key in keys:
            d, _, tp = key.partition(":")
            if tp and d in self.dims and tp in self.types:
                mask |= (self.dim == self.dims.index(d)) & (self.type == self.types.index(tp))
        return mask

    def retime(self, mult: np.ndarray, free_dims: frozenset = frozenset(), use_c: bool = True) -> float:
        """The step's duration (ns, the longest rank's step: end - start) with rank row k's categories scaled
        by mult[k] (the compute that ran beside a collective by the scale of comm_overlapped) and
        the collectives `free(free_dims)` overlapped: after their last member arrives they take only
        the compute that ran beside them. In C where it was built (`_retime.c`, the
        same pass); the loop below is the reference."""
        window = np.einsum("ij,ij->i", self.pre, mult[self.rank_row])
        tail = np.einsum("ij,ij->i", self.tail, mult)
        # the compute beside a collective (an async send while the next microbatch computes) takes
        # its rank's compute scale
        beside = self.beside * mult[self.rank_row, _OVERLAPPED]
        transfer = self.transfer - self.beside + beside
        if free_dims:
            transfer = np.where(self.free(free_dims), beside, transfer)
        if use_c and _c_retime is not None:
            return _c_retime.step(self.dep, self.fixed, window, self.arrival, self.duration, self.last_member,
                                  self.link, self.offsets, self.members, transfer, self.last, self.start, tail)
        window = window.tolist()
        n = len(window)
        new_a: list[float] = self.arrival.tolist()   # instances 0 .. k-1 (arrived): their new arrival
        new_e: list[float | None] = [None] * n
        last_member, duration, link, transfer = (self.last_member.tolist(), self.duration.tolist(),
                                                 self.link.tolist(), transfer.tolist())
        offsets, members = self.offsets.tolist(), self.members.tolist()

        def end_of(k: int, arrived: int) -> float:
            v = new_e[k]
            if v is None:
                if last_member[k] >= arrived:            # not a link, or a member has not arrived yet
                    v = new_a[k] + duration[k]
                else:
                    v = max(new_a[m] for m in members[offsets[link[k]]:offsets[link[k] + 1]]) + transfer[k]
                new_e[k] = v
            return v

        for k, (dep, fixed, w) in enumerate(zip(self.dep.tolist(), self.fixed.tolist(), window)):
            new_a[k] = (end_of(dep, k) if dep >= 0 else fixed) + w
        return max((end_of(last, n) if last >= 0 else start) + t - start
                   for last, start, t in zip(self.last.tolist(), self.start.tolist(), tail.tolist()))

    def scales(self, mult: dict[int, np.ndarray]) -> np.ndarray:
        """Per rank row, its categories' scale (1 where `mult` says nothing)."""
        out = np.ones((len(self.ranks), _N))
        for k, r in enumerate(self.ranks):
            if r in mult:
                out[k] = mult[r]
        return out


def _retime(s: int, rk: dict[int, _Rank], links: _Links, mult: dict[int, np.ndarray],
            free_dims: frozenset = frozenset()) -> float:
    """The job's step s re-timed (ns, the longest rank's step) with each rank's categories scaled
    by `mult[rank]` (default 1) and the collectives of `free_dims` overlapped (`_StepPlan.retime`)."""
    plan = _StepPlan(s, rk, links)
    return plan.retime(plan.scales(mult), free_dims)


@dataclass
class _Change:
    """One what-if before it is re-timed: what it says, its categories' scales per rank, the
    collectives it overlaps, and the most it can save (ms per step: what the path holds of what it
    removes; None: no bound)."""
    what: WhatIf
    mult: dict[int, np.ndarray]
    free: frozenset = frozenset()
    cap_ms: float | None = None


def _scale(categories: Sequence[str], factor: float) -> np.ndarray:
    m = np.ones(_N)
    m[[CATEGORIES.index(c) for c in categories]] = factor
    return m


def _rank_groups(r: _Rank, causes: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The straggler causes (`causes`: stragglers.CAUSE_GROUPS, communication left out) and their
    categories; on a CPU-only rank the training thread's ops are its CPU ops (cause cpu_ops)."""
    groups = {g: c for g, c in causes.items() if g != "communication"}
    if r.cpu_only and "gpu_compute" in groups:
        groups["cpu_ops"] = groups.pop("gpu_compute") + groups.get("cpu_ops", ())
    return groups


def _what_ifs(cp: CriticalPath, rk: dict[int, _Rank], links: _Links, steps: list[int],
              pipe: Pipeline | None, t: Thresholds, exposed: dict[str, float],
              stragglers: Sequence[tuple[int, str]], causes: dict[str, tuple[str, ...]]) -> list[WhatIf]:
    """The what-ifs (`WHAT_IF_KEYS`), each re-timed over every step; savings are means over the
    steps, never negative and never above what the path holds of what the change removes."""
    n = len(cp.steps)
    held: dict[tuple[int, str], float] = {}            # (rank, breakdown category) -> ms per step on the path
    for p in cp.steps:
        for sg in p.segments:
            held[(sg.rank, sg.category)] = held.get((sg.rank, sg.category), 0.0) + sg.dur_ms / n
    min_ms = t["critical_path_what_if_min_pct"] * cp.step_ms / 100.0
    changes: list[_Change] = []
    # a rank's cause at the median rank's level (the median of the other ranks): the stragglers'
    # causes, and the two ranks most on the path where they spend more than the median rank
    means = {r.rank: r.mean_ns for r in rk.values()}
    on_path: dict[int, float] = {}
    for x in cp.by_rank_category:
        on_path[x.rank] = on_path.get(x.rank, 0.0) + x.ms_per_step
    wanted = [(r, c) for r, c in stragglers if r in rk] + \
        [(r, None) for r in sorted(on_path, key=lambda r: -on_path[r])[:2]]
    seen = set()
    for r, cause in wanted:
        for group, cats in _rank_groups(rk[r], causes).items():
            if (r, group) in seen or (cause is not None and group != cause) or len(rk) < 2:
                continue
            idx = [CATEGORIES.index(c) for c in cats]
            own = float(means[r][idx].sum())
            med = float(np.median([v[idx].sum() for q, v in means.items() if q != r]))
            if own <= med or (cause is None and (own - med) / NS_PER_MS < min_ms):
                continue
            seen.add((r, group))
            label = GROUP_LABEL[group] if not (group == "cpu_ops" and rk[r].cpu_only) else "CPU op time"
            what = WhatIf(r, f"rank {r}: its {label} at the median rank's level ({own / NS_PER_MS:,.1f} -> "
                             f"{med / NS_PER_MS:,.1f} ms per step)", 0.0, key=f"rank:{r}:{group}", ranks=[r])
            cap = sum(held.get((r, c), 0.0) for c in cats) * (1.0 - med / own)
            changes.append(_Change(what, {r: _scale(cats, med / own)}, cap_ms=cap))
    # a category removed on every rank (one fix for all: more DataLoader workers, no syncs)
    for group, cats in EVERY_RANK.items():
        on = sum(v for (_, c), v in held.items() if c in cats)
        if len(rk) > 1 and on >= min_ms / 5.0:
            what = WhatIf(None, f"every rank: its {GROUP_LABEL[group]} removed", 0.0, key=f"every:{group}")
            changes.append(_Change(what, {r: _scale(cats, 0.0) for r in rk}, cap_ms=on))
    # communication overlapped: per dimension, FSDP's parameter all-gathers, all of it (where that
    # is not one dimension's)
    keys = {k for r in rk.values() for i in range(len(r.type)) for k in r.overlap_keys(i)}
    dims = sorted({k for k in keys if ":" not in k and k != "*"})
    wanted_keys = [d for d in dims if d] + [f"{d}:all_gather" for d in dims if d and f"{d}:all_gather" in keys
                                             and f"{d}:reduce_scatter" in keys]
    if len(dims) != 1 or not dims[0]:
        wanted_keys.append("*")
    for key in wanted_keys:
        if exposed.get(key, 0.0) <= 0.0:
            continue
        d, _, tp = key.partition(":")
        text = ("all communication overlapped" if key == "*" else
                f"{d} parameter all-gathers overlapped" if tp else f"{d} communication overlapped")
        what = WhatIf(None, f"{text} (each collective takes only the wait for its last member and the "
                            f"compute beside it)", 0.0, key=f"overlap:{key}")
        changes.append(_Change(what, {}, frozenset({key}), cap_ms=exposed[key]))
    pp_exposed = sum(held.get((r, "comm_exposed"), 0.0) for r in rk) if pipe else 0.0
    model = _pipeline_model(pipe, rk, links)
    if pipe is not None and model is None and len(pipe.stages) > 1 and pipe.bottleneck_stage is not None:
        # no schedule to rebuild (unknown, or no microbatch count): the measured graph, re-timed
        mult = _balanced(pipe, rk)
        what = WhatIf(None, BALANCED, 0.0, key="pp:balanced")
        changes.append(_Change(what, mult, cap_ms=pp_exposed + _lost_compute(held, mult)))
    # saved = the unchanged re-timing minus the changed one, mean over the steps; one step's plan at a time
    saved = np.zeros((len(steps), len(changes)))
    replay_error = []
    replayed = measured = 0.0
    instances = _Instances(rk, links)
    for k, s in enumerate(steps):
        plan = _StepPlan(s, rk, links, instances)
        unchanged = plan.retime(plan.scales({}))
        truth = max(r.steps[s][1] - r.steps[s][0] for r in rk.values())
        replayed, measured = replayed + unchanged, measured + truth
        replay_error.append(100.0 * abs(unchanged - truth) / truth if truth > 0 else 0.0)
        for c, change in enumerate(changes):
            saved[k, c] = unchanged - plan.retime(plan.scales(change.mult), change.free)
    if steps:
        cp.measured_step_ms = round(measured / len(steps) / NS_PER_MS, 3)
        cp.replayed_step_ms = round(replayed / len(steps) / NS_PER_MS, 3)
        cp.replay_error_pct = round(float(np.mean(replay_error)), 3)
        cp.replay_error_max_pct = round(float(np.max(replay_error)), 3)
    out = []
    for c, change in enumerate(changes):
        ms = max(0.0, float(saved[:, c].mean()) / NS_PER_MS if len(steps) else 0.0)
        if change.cap_ms is not None:
            ms = min(ms, change.cap_ms)
        change.what.step_ms_saved = round(ms, 3)
        out.append(change.what)
    if model is not None and pipe is not None:      # a model: of a pipeline
        out += _schedule_what_ifs(model, pp_exposed, pp_exposed + _lost_compute(held, _balanced(pipe, rk)))
    return out


def _balanced(pipe: Pipeline, rk: dict[int, _Rank]) -> dict[int, np.ndarray]:
    """Per rank of the pipeline's stages, the scale that brings its stage's compute to the stages' mean."""
    mean = float(np.mean([st.compute_ms_per_step for st in pipe.stages]))
    return {r: _scale(("compute", "comm_overlapped"), mean / st.compute_ms_per_step if st.compute_ms_per_step > 0
                      else 1.0) for st in pipe.stages for r in st.ranks if r in rk}


def _lost_compute(held: dict[tuple[int, str], float], mult: dict[int, np.ndarray]) -> float:
    """The compute the path loses (ms per step) where `mult` scales a rank's compute down."""
    return sum(held.get((r, c), 0.0) * max(0.0, 1.0 - m[_COMPUTE[0]]) for r, m in mult.items()
               for c in ("compute", "comm_overlapped"))


def _pipeline_model(pipe, rk: dict[int, _Rank], links: _Links) -> PipelineModel | None:
    """The measured pipeline as `pipeline_schedule` rebuilds it; None without a known schedule and
    microbatch count."""
    if pipe is None or not pipe.microbatches or pipe.schedule not in ("gpipe", "1f1b", "interleaved") or \
            len(pipe.stages) < 2:
        return None
    host = [CATEGORIES.index(c) for c in ("host", "idle_other")]
    return PipelineModel(
        compute_ms=[st.compute_ms_per_step for st in pipe.stages],
        host_ms=[float(np.mean([rk[r].mean_ns[host].sum() for r in st.ranks if r in rk] or [0.0])) / NS_PER_MS
                 for st in pipe.stages],
        hop_ms=_hop_ms(rk, links), microbatches=pipe.microbatches, chunks=max(pipe.stages_per_rank, 1),
        schedule=pipe.schedule)


def _hop_ms(rk: dict[int, _Rank], links: _Links) -> float:
    """A pipeline hop: the median transfer of the pp send/recv pairs (ms; the shortest member's end
    after the last arrival)."""
    hops = [min(int(rk[q].e[i]) for q, i in mem) - links.last_arrival[cid] for cid, mem in links.members.items()
            if rk[mem[0][0]].dim[mem[0][1]] == "pp"]
    return max(0.0, float(np.median(hops)) / NS_PER_MS) if hops else 0.0


def _schedule_what_ifs(model: PipelineModel, pp_exposed: float, balanced_cap: float) -> list[WhatIf]:
    """The pipeline rebuilt and re-timed by `pipeline_schedule.makespan`: its stages balanced (each
    stage's compute at their mean), twice the microbatches, and (where the schedule is not
    interleaved yet) two model chunks per rank. Never above what the path holds: its pipeline
    waits (pp exposed communication), and for balancing the compute it loses on slower stages."""
    now = makespan(model)
    mean = float(np.mean(model.compute_ms))
    balanced = PipelineModel([mean] * len(model.compute_ms), model.host_ms, model.hop_ms, model.microbatches,
                             model.chunks, model.schedule)
    out = [WhatIf(None, BALANCED, round(min(max(0.0, now - makespan(balanced)), balanced_cap), 3), key="pp:balanced")]
    m, p = model.microbatches, len(model.compute_ms)
    for text, key, mb, chunks in (
            (f"pipeline with {2 * m} microbatches instead of {m} (the same batch)", f"pp:microbatches:{2 * m}",
             2 * m, model.chunks),
            ("interleaved schedule, 2 model chunks per rank (virtual stages)", "pp:interleaved:2", m, 2)):
        if key.startswith("pp:interleaved") and model.chunks > 1:
            continue
        theory = theory_saving_ms(model, mb, chunks)
        ms = min(max(0.0, now - makespan(model, mb, chunks, "interleaved" if chunks > 1 else None)), pp_exposed)
        out.append(WhatIf(None, f"{text}; (p-1)/(m+p-1) with {p} equal stages says {theory:,.1f} ms", round(ms, 3),
                          key=key, theory_step_ms_saved=round(theory, 3)))
    return out


BALANCED = "pipeline stages balanced (each stage's compute at the stages' mean)"
#: The groups of breakdown categories a what-if can change, in words.
GROUP_LABEL = {"host_idle": "host_idle (main thread outside any op)", "dataloader": "DataLoader wait",
               "cpu_ops": "CPU op time (device idle)", "gpu_compute": "compute", "memcpy": "memcpy time",
               "sync": "synchronize waits", "host": "host-side op time (device idle)"}
#: The categories a what-if removes on every rank at once.
EVERY_RANK = {"dataloader": ("dataloader",), "host_idle": ("idle_other",), "sync": ("sync",), "host": ("host",)}
#: The what-ifs' keys (`WhatIf.key`), which the findings look up: "rank:<r>:<cause>" (a straggler
#: cause of rank r at the median rank's level), "every:<group>" (`EVERY_RANK`), "overlap:<dim>",
#: "overlap:<dim>:all_gather", "overlap:*" (communication overlapped), "pp:balanced",
#: "pp:microbatches:<m>", "pp:interleaved:2".
WHAT_IF_KEYS = ("rank:", "every:", "overlap:", "pp:")
