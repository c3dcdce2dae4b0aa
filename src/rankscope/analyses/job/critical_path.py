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
started: pipeline send/recv pairs are matched by time (`_pair_p2p`: the send of a neighbouring stage
whose end is closest to the recv's end, their spans overlapping).

**The path** is walked back from the end of the rank whose step ends last: through its tail to the
end of its last collective; there, if another member arrived last, the path goes to that member at
its arrival (the transfer after it stays on the first rank), else through the collective to the
rank's own arrival; then through the pre window to the previous collective's end, and so on, until
the step start of the rank the walk began on. The segments tile that step exactly (a rank whose
step started later contributes the gap as `idle_other`). Inside a window the categories are laid out
in breakdown order (the window's exact total per category, not their order in time).

**What-if** re-times the graph (not a subtraction): every arrival is the end of what it depends on
plus its (changed) pre window; every collective ends at its members' latest (changed) arrival plus
its transfer; the step ends at its last collective plus its (changed) tail. The job's step is the
latest end over ranks from the earliest start; saved = the re-timed step with no change minus with
the change, mean over steps. Changes: a rank's time in one category removed (its `host_idle`, its
DataLoader wait); one dimension's communication fully overlapped (its collectives cost only the wait
for their last member); the pipeline's stages balanced (each stage's compute scaled to the stages'
mean).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from rankscope.analyses.job.matching import CollectiveTable
from rankscope.analyses.job.parallel import ParallelReport
from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.analyses.rank.collectives import RankCollectives
from rankscope.thresholds import Thresholds, resolve
from rankscope.units import NS_PER_MS

try:
    from rankscope.analyses import _retime as _c_retime      # the re-timing pass in C
except ImportError:                                            # built without a C compiler: `_StepPlan.retime`'s loop
    _c_retime = None

_N = len(CATEGORIES)
_IDLE = CATEGORIES.index("idle_other")
_COMPUTE = (CATEGORIES.index("compute"), CATEGORIES.index("comm_overlapped"))
#: The path's name for idle_other: the straggler vocabulary's host_idle.
PATH_CATEGORY = {c: ("host_idle" if c == "idle_other" else c) for c in CATEGORIES}
#: Work a what-if can take away from one rank (category -> what the change says).
REMOVABLE = {"idle_other": "remove its host_idle (main thread outside any op)",
             "dataloader": "shorten its DataLoader wait to zero",
             "sync": "remove its synchronize waits", "host": "remove its host-side op time (device idle)"}


@dataclass
class Segment:
    rank: int
    category: str                    # a step-breakdown category
    name: str                        # the collective (type and dimension) or the window it belongs to
    start_ms: float                  # from the step's start
    dur_ms: float


@dataclass
class StepPath:
    step: int
    duration_ms: float
    segments: list[Segment] = field(default_factory=list)
    start_ns: int = 0                # the step's start on the aligned clock (segments' start_ms count from it)


@dataclass
class RankCategory:
    rank: int
    category: str                    # "host_idle" | a step-breakdown category
    ms_per_step: float
    pct_of_step: float


@dataclass
class WhatIf:
    rank: int | None                 # None: a job-wide change
    change: str
    step_ms_saved: float


@dataclass
class Lane:
    """One rank in a swimlane: its step window and its collectives, ms from the step's start:
    arrival, the last member's arrival (its wait ends), end; with their names."""
    rank: int
    step_start_ms: float
    step_end_ms: float
    collectives: list[list[float]] = field(default_factory=list)     # [arrival, last arrival, end]
    names: list[str] = field(default_factory=list)


@dataclass
class Swimlane:
    step: int
    label: str                       # "slowest step" | "median step"
    lanes: list[Lane] = field(default_factory=list)


@dataclass
class CriticalPath:
    steps: list[StepPath] = field(default_factory=list)
    by_rank_category: list[RankCategory] = field(default_factory=list)
    what_if: list[WhatIf] = field(default_factory=list)
    step_ms: float = 0.0                               # mean path duration
    owner: int | None = None                           # the rank holding >= critical_path_owner_pct of the path
    owner_pct: float = 0.0                             # the largest share of the path one rank holds
    swimlanes: list[Swimlane] = field(default_factory=list)   # the slowest and the median step


class _Rank:
    """One rank's instances on the aligned clock, and its steps."""

    def __init__(self, rc: RankCollectives, offset_ns: int):
        n = len(rc)
        self.rank = rc.rank
        self.a = np.asarray(rc.start_ns, dtype=np.int64)[:n] - offset_ns
        self.e = np.asarray(rc.end_ns, dtype=np.int64)[:n] - offset_ns
        self.w = (np.asarray(rc.window_start_ns, dtype=np.int64) - offset_ns) if len(rc.window_start_ns) == n \
            else self.a.copy()
        self.step = np.asarray(rc.step, dtype=np.int64)
        self.pre = rc.pre_matrix() if n else np.zeros((0, _N), np.int64)
        self.type = list(rc.type)
        self.dim = list(rc.dim) if len(rc.dim) == n else [""] * n
        ovl, exp = rc.owned_ns()
        self.comm_cat = np.where(ovl > exp, CATEGORIES.index("comm_overlapped"), CATEGORIES.index("comm_exposed"))
        self.steps = {int(s): (int(a) - offset_ns, int(b) - offset_ns)
                      for s, a, b in zip(rc.steps, rc.step_start_ns, rc.step_end_ns)}
        tails = np.asarray(rc.step_tail_ns, dtype=np.int64).reshape(-1, _N) if len(rc.step_tail_ns) else \
            np.zeros((0, _N), np.int64)
        self.tail = {int(s): tails[k] for k, s in enumerate(rc.steps) if k < len(tails)}
        self.by_step: dict[int, list[int]] = {}
        for i in np.argsort(self.a, kind="stable"):
            self.by_step.setdefault(int(self.step[i]), []).append(int(i))
        bd = rc.breakdown_matrix()
        self.compute_ns = float(bd[:, list(_COMPUTE)].sum(axis=1).mean()) if len(bd) else 0.0
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


def critical_path(ranks: Sequence[RankCollectives], table: CollectiveTable, parallel: ParallelReport | None,
                  thresholds: Thresholds | None = None) -> CriticalPath | None:
    """The critical path of every step the ranks share, its attribution and the what-ifs (module
    docstring); None without steps."""
    t = resolve(thresholds)
    offsets = table.offsets_ns
    rk = {rc.rank: _Rank(rc, int(offsets.get(rc.rank, 0))) for rc in ranks if rc.steps}
    if not rk:
        return None
    links = _links(table, rk, parallel)
    steps = sorted(set.intersection(*(set(r.steps) for r in rk.values())))
    out = CriticalPath()
    for s in steps:
        path = _walk(s, rk, links)
        if path is not None:
            out.steps.append(path)
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
    out.what_if = _what_ifs(out, rk, links, steps, parallel, t)
    by_duration = sorted(out.steps, key=lambda p: p.duration_ms)
    picks = [(by_duration[-1], "slowest step")]
    if len(by_duration) > 1:
        picks.append((by_duration[(len(by_duration) - 1) // 2], "median step"))
    out.swimlanes = [_swimlane(p.step, label, rk, links) for p, label in picks]
    return out


def _swimlane(s: int, label: str, rk: dict[int, _Rank], links: _Links) -> Swimlane:
    end_rank = max(rk.values(), key=lambda r: (r.steps[s][1], -r.rank))
    t0 = end_rank.steps[s][0]
    ms = lambda v: round((int(v) - t0) / NS_PER_MS, 4)
    out = Swimlane(s, label)
    for r in sorted(rk.values(), key=lambda r: r.rank):
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


def _links(table: CollectiveTable, rk: dict[int, _Rank], parallel: ParallelReport | None) -> _Links:
    of, members = {}, {}
    m = table.members
    if m.height:
        for cid, rank, idx in zip(*(m[c].to_list() for c in ("cid", "rank", "idx"))):
            if rank in rk:
                of[(rank, idx)] = cid
                members.setdefault(cid, []).append((rank, idx))
    next_id = (max(members) + 1) if members else 0
    for pair in _pair_p2p(rk, parallel, of):
        for key in pair:
            of[key] = next_id
        members[next_id] = list(pair)
        next_id += 1
    last_arrival, last_member = {}, {}
    for cid, mem in members.items():
        best = max(mem, key=lambda k: (rk[k[0]].a[k[1]], -k[0]))
        last_member[cid] = best
        last_arrival[cid] = int(rk[best[0]].a[best[1]])
    return _Links(of, members, last_arrival, last_member)


def _pair_p2p(rk: dict[int, _Rank], parallel: ParallelReport | None, taken: dict) -> list[tuple]:
    """Pipeline sends matched to recvs (not matched by the collective table): per recv, the unused
    send of another rank of its pp group whose span overlaps it and whose end is closest to its end."""
    pp = parallel.layout.dim("pp") if parallel else None
    if pp is None:
        return []
    pairs = []
    for group in pp.groups:
        sends = sorted(((int(rk[r].e[i]), int(rk[r].a[i]), r, i) for r in group if r in rk
                        for i, tp in enumerate(rk[r].type) if tp == "send" and (r, i) not in taken))
        ends = [x[0] for x in sends]
        used = set()
        recvs = sorted(((int(rk[r].e[i]), int(rk[r].a[i]), r, i) for r in group if r in rk
                        for i, tp in enumerate(rk[r].type) if tp == "recv" and (r, i) not in taken))
        for e_r, a_r, r, i in recvs:
            k = bisect.bisect_left(ends, e_r)
            best = None
            for j in range(max(0, k - 8), min(len(sends), k + 8)):
                e_s, a_s, q, x = sends[j]
                if j in used or q == r or a_s > e_r or e_s < a_r:
                    continue
                if best is None or abs(e_s - e_r) < abs(sends[best][0] - e_r):
                    best = j
            if best is not None:
                used.add(best)
                pairs.append(((r, i), (sends[best][2], sends[best][3])))
    return pairs


# ------------------------------------------------------------------------------------------- walk
def _walk(s: int, rk: dict[int, _Rank], links: _Links) -> StepPath | None:
    end_rank = max(rk.values(), key=lambda r: (r.steps[s][1], -r.rank))
    t0, t_end = end_rank.steps[s]
    if t_end <= t0:
        return None
    raw: list[tuple[int, int, int, int, str]] = []     # (rank, category, start, end, name), backwards

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
                if cid is not None and links.last_member[cid][0] != cur.rank and a_i < links.last_arrival[cid] < e_i:
                    la = links.last_arrival[cid]
                    raw.append((cur.rank, int(cur.comm_cat[i]), la, e_i, cur.name(i)))
                    q, k = links.last_member[cid]
                    cur, tt, state = rk[q], la, ("arrival", k)
                    continue
                if e_i > a_i:
                    raw.append((cur.rank, int(cur.comm_cat[i]), a_i, e_i, cur.name(i)))
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
    for rank, c, a, b, name in sorted(raw, key=lambda x: (x[2], x[3])):
        a, b = max(a, t0), min(b, t_end)
        if b > a:
            segments.append(Segment(rank, CATEGORIES[c], name, round((a - t0) / NS_PER_MS, 6),
                                    round((b - a) / NS_PER_MS, 6)))
    return StepPath(s, round((t_end - t0) / NS_PER_MS, 6), segments, int(t0))


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
        self.pre = np.concatenate([r.pre for r in ranks]) if ranks else np.zeros((0, _N), np.int64)
        for r, lo, hi in zip(ranks, first[:-1], first[1:]):
            r.a, r.e, r.w = self.a[lo:hi], self.e[lo:hi], self.w[lo:hi]
            r.step, r.pre = self.step[lo:hi], self.pre[lo:hi]
        waited = joined([np.asarray(r.before_window, dtype=np.int64) for r in ranks])
        self.waited = np.where(waited >= 0, waited + first[:-1][self.row], -1).astype(np.int32)  # in this numbering
        self.dims = sorted({d for r in ranks for d in r.dim})
        code = {d: k for k, d in enumerate(self.dims)}
        self.dim = np.array([code[d] for r in ranks for d in r.dim], dtype=np.int32)
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

    def retime(self, mult: np.ndarray, free_dims: frozenset = frozenset(), use_c: bool = True) -> float:
        """The step's duration (ns, latest end - earliest start) with rank row k's categories scaled
        by mult[k] and the collectives of `free_dims` costing no transfer. In C where it was built
        (`_retime.c`, the same pass); the loop below is the reference."""
        window = np.einsum("ij,ij->i", self.pre, mult[self.rank_row])
        tail = np.einsum("ij,ij->i", self.tail, mult)
        transfer = self.transfer
        if free_dims:
            transfer = np.where(np.isin(self.dim, [k for k, d in enumerate(self.dims) if d in free_dims]), 0.0, transfer)
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
        ends = [(end_of(last, n) if last >= 0 else start) + t
                for last, start, t in zip(self.last.tolist(), self.start.tolist(), tail.tolist())]
        return max(ends) - min(self.start.tolist())

    def scales(self, mult: dict[int, np.ndarray]) -> np.ndarray:
        """Per rank row, its categories' scale (1 where `mult` says nothing)."""
        out = np.ones((len(self.ranks), _N))
        for k, r in enumerate(self.ranks):
            if r in mult:
                out[k] = mult[r]
        return out


def _retime(s: int, rk: dict[int, _Rank], links: _Links, mult: dict[int, np.ndarray],
            free_dims: frozenset = frozenset()) -> float:
    """The job's step s re-timed (ns, latest end - earliest start) with each rank's categories scaled
    by `mult[rank]` (default 1) and the collectives of `free_dims` costing no transfer."""
    plan = _StepPlan(s, rk, links)
    return plan.retime(plan.scales(mult), free_dims)


def _what_ifs(cp: CriticalPath, rk: dict[int, _Rank], links: _Links, steps: list[int],
              parallel: ParallelReport | None, t: Thresholds) -> list[WhatIf]:
    changes: list[tuple[WhatIf, dict[int, np.ndarray], frozenset]] = []    # each: its scales, its free dims
    min_ms = t["critical_path_what_if_min_pct"] * cp.step_ms / 100.0
    for x in cp.by_rank_category:
        c = "idle_other" if x.category == "host_idle" else x.category
        if c in REMOVABLE and x.ms_per_step >= min_ms and len(changes) < 4:
            m = np.ones(_N)
            m[CATEGORIES.index(c)] = 0.0
            changes.append((WhatIf(x.rank, f"rank {x.rank}: {REMOVABLE[c]}", 0.0), {x.rank: m}, frozenset()))
    # the ranks most on the path, when they compute more than the median rank: at its pace
    median_compute = float(np.median([r.compute_ns for r in rk.values()]))
    on_path: dict[int, float] = {}
    for x in cp.by_rank_category:
        on_path[x.rank] = on_path.get(x.rank, 0.0) + x.ms_per_step
    for r in sorted(on_path, key=lambda r: -on_path[r])[:2]:
        own = rk[r].compute_ns
        if len(rk) > 1 and own > median_compute * (1.0 + t["critical_path_what_if_min_pct"] / 100.0):
            m = np.ones(_N)
            m[list(_COMPUTE)] = median_compute / own
            changes.append((WhatIf(r, f"rank {r}: compute at the median rank's pace ({own / NS_PER_MS:,.1f} -> "
                                      f"{median_compute / NS_PER_MS:,.1f} ms per step)", 0.0), {r: m}, frozenset()))
    if parallel is not None:
        for d in parallel.layout.dims:
            if d.name != "pp":
                changes.append((WhatIf(None, f"{d.name} communication fully overlapped (each collective costs only "
                                             f"the wait for its last member)", 0.0), {}, frozenset({d.name})))
        p = parallel.pipeline
        if p is not None and len(p.stages) > 1 and p.bottleneck_stage is not None:
            mean = float(np.mean([st.compute_ms_per_step for st in p.stages]))
            mult = {}
            for st in p.stages:
                f = mean / st.compute_ms_per_step if st.compute_ms_per_step > 0 else 1.0
                for r in st.ranks:
                    m = np.ones(_N)
                    m[list(_COMPUTE)] = f
                    mult[r] = m
            changes.append((WhatIf(None, "pipeline stages balanced (each stage's compute at the stages' mean)", 0.0),
                            mult, frozenset()))
    # saved = the unchanged re-timing minus the changed one, mean over the steps; one step's plan at a time
    saved = np.zeros((len(steps), len(changes)))
    instances = _Instances(rk, links)
    for k, s in enumerate(steps):
        plan = _StepPlan(s, rk, links, instances)
        unchanged = plan.retime(plan.scales({}))
        for c, (_, mult, free) in enumerate(changes):
            saved[k, c] = unchanged - plan.retime(plan.scales(mult), free)
    for c, (what, _, _) in enumerate(changes):
        what.step_ms_saved = round(float(saved[:, c].mean()) / NS_PER_MS, 3) if len(steps) else 0.0
    return [what for what, _, _ in changes]
