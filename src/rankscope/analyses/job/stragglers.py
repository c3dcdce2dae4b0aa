"""Stragglers, step-time variance and load balance across ranks (docs/concepts.md "Straggler").

A reduce over the ranks' `RankCollectives` (collectives.py) only: no event frames.

Per rank:
  - step time: mean, std and coefficient of variation across its steps; z-score of its mean against
    the ranks' means (population std), % over the mean, and the share of steps in which it is the
    slowest rank ("a rank with consistently higher step time"). The usual outlier rule flags z > 2 or > 10 % over
    the mean (`step_time_outlier`: `straggler_step_z`, `straggler_step_pct`). In synchronous
    data-parallel jobs every rank's step lasts as long as the slowest rank's, so this is weak
    evidence there: the collectives carry the signal.
  - collectives (after clock alignment, clock.py): how often it arrived last, the wait it imposed
    (median over the other ranks of the time they waited in collectives where it was last; one
    rank's waits in concurrent collectives count once), its own wait (concurrent waits counted
    once too, inside its step windows), and the what-if below.

Every value that decides a verdict is a `rankscope.thresholds` entry (`straggler_*`, `load_*`),
read from the `Thresholds` the caller resolved (`reduce_job(..., thresholds=)`).

A rank is a **straggler** when it arrived last at >= `last_share_min(n)` of its collectives, or
holds that share of the job's last-arrival lateness (the sum over collectives of last arrival -
next-latest arrival: when collectives queue on one stream, a late rank is last at the first of a
burst only, and the rest of the burst starts together), AND its cost is >=
`straggler_min_cost_pct_of_step` % of the median step time (and >= `straggler_min_cost_ms`). The
search runs in rounds (`straggler_max_rounds`): stragglers found are taken out and the collectives
re-matched among the other ranks, so a smaller straggler hidden behind a bigger one is found too
(its cost is then "once the first one is fixed"). Without matched collectives (ranks that do not
communicate), a step-time outlier is the only evidence.

**Cause and cost** (the what-if "if it ran like the median rank"): in each step where the rank was
last, take the last collective K of that step where it was last, and compare what the rank did from
its step start to its arrival at K (`since_step_ns`: durations, so clock offsets do not matter) with
the median of the other members of K, grouped by cause (`CAUSE_GROUPS`):
  gpu_compute <- compute + comm_overlapped (COMP ran; on CPU-only jobs this is the training
                 thread's ops, reported as cpu_ops) · communication <- comm_exposed ·
  memcpy <- memcpy · dataloader <- dataloader · cpu_ops <- host + sync · host_idle <- idle_other.
`comm_overlapped` goes with compute, not communication: COMP ran there, and a rank that computes
longer shows part of it as overlapped time; only exposed communication can make a rank late.
The other members' window runs to the straggler's arrival too: after their own arrival they sat
in K waiting (their `wait`), which counts as communication.
excess[g] = rank's time in g - median over the others. Then, per step:
  work excess  A = sum of the positive excesses outside communication (what it did that they did not),
  others' wait B = -excess[communication] (how much longer the others sat in exposed communication,
                   waits in K included),
  lateness     L = per collective where it was last, [next-latest arrival, its arrival]: the length
                   of their union (concurrent collectives, e.g. gloo's two worker threads, count once),
  blocking     I = the part of its lateness on the others' critical path: over the step's
                   collectives, the union of the time during which every other member had arrived
                   and done its own work so far (`_progress`: own work = COMP, `last_work_ns`; an
                   arrival not queued behind the rank's previous collective also shows its progress)
                   while it had not (not arrived, or still working), before the collective started.
cost = min(A, B, I) per step (0 in steps where it was never last), averaged over the steps with
collectives: how much the others' steps would shorten if it ran like the median rank. Each bound
alone overstates in some case. A and B compare breakdown categories, in which the others' waits
hide what they did meanwhile (exposed communication takes priority over host time: on a launch-
bound job their host keeps launching while their all-reduces wait, and that launch time shows up as
the late rank's excess `cpu_ops`). L counts waits the others spent working: DDP all-reduces overlap
backward, so a rank 1-3 % slower on the host (synth's per-rank speed noise) is last at every bucket
of a launch-bound step by its own pace between buckets, yet it holds the others up only once they
have finished backward (measured: L 5.6 ms, I 0.36 ms, the generator's counterfactual with that rank
at the median speed 0.45 ms of a 29 ms step). I leaves out waits during which another rank still
had work: with two stragglers, each one's cost is what fixing it alone would gain (synth, 32 ranks,
20 ms DataLoader on rank 17 and 10 ms host idle on rank 5: 14.4 ms/step for rank 17, the generator's
counterfactual 14.4). In later rounds the rank's end is the collective's real start (the stragglers
of earlier rounds included): without them the others would have waited for this rank's work.
cause = the group with the largest summed excess over those steps, if it explains at least
`straggler_cause_min_share` of the positive excess; else `unknown`. Also `unknown` when the rank started
those steps late (its step start minus the other members' median, aligned clocks) by at least
`straggler_cause_min_share` of its lateness L: then the delay lies before the step (in synchronous training
steps start together; param-dlrm-8rank's single profiled step starts 1.2-8.7 ms apart).

**Load balance** ("all ranks idle at the same time" vs "one rank late"), from the ranks'
step breakdowns: per step, the idle share every rank has (min over ranks of device-idle time / step;
device idle = dataloader + sync + host + idle_other) and the wait spread: how much longer the median
rank sits in exposed communication than the rank that sits there least, over the median step. Ranks
that wait for a late one sit in exposed communication while it works; a job that is slow everywhere
(no overlap, slow network) has exposed communication on every rank alike, and no spread. Verdict:
"one_rank_late" (stragglers found), "all_ranks_idle" (common idle >= `load_all_idle_pct`),
"rotating_lateness" (wait spread >= `load_wait_imbalance_pct` without a single rank to blame), else
"balanced".
"""
from __future__ import annotations

from typing import Sequence, cast

import numpy as np
import polars as pl

from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.analyses.job.clock import applied_offsets, estimate_clock_offsets
from rankscope.analyses.job.matching import CollectiveTable, match_collectives, member_frame, since_step_rows
from rankscope.analyses.rank.collectives import breakdown_matrix
from rankscope.analyses.intervals import union, union_length_per_group
from rankscope.numbers import rank_list
from rankscope.thresholds import Thresholds, resolve
from rankscope.units import NS_PER_MS, NS_PER_US
from rankscope.results.clock import ClockAlignment
from rankscope.results.collectives import Collectives
from rankscope.results.pipeline import Pipeline
from rankscope.results.stragglers import (COST_DEFINITION, LoadBalance, LoadBalanceStep, LoadVerdict, RankStats,
                                         Straggler, StragglerCause, StragglerReport, StragglerThresholds)


CAUSES = ("dataloader", "host_idle", "cpu_ops", "gpu_compute", "memcpy", "communication", "pipeline_stage",
          "unknown")
#: Breakdown categories (breakdown.CATEGORIES) summed into each cause.
CAUSE_GROUPS: dict[str, tuple[str, ...]] = {
    "gpu_compute": ("compute", "comm_overlapped"),
    "communication": ("comm_exposed",),
    "memcpy": ("memcpy",),
    "dataloader": ("dataloader",),
    "cpu_ops": ("host", "sync"),
    "host_idle": ("idle_other",),
}
IDLE_CATEGORIES = ("dataloader", "sync", "host", "idle_other")
_GROUPS = list(CAUSE_GROUPS)
_GROUP_MATRIX = np.array([[1 if c in CAUSE_GROUPS[g] else 0 for g in _GROUPS] for c in CATEGORIES], dtype=np.int64)


def last_share_min(n_ranks: int, t: Thresholds) -> float:
    """The last-arrival share (0-1) that makes a straggler among `n_ranks`."""
    return max(t["straggler_last_share_min"], min(1.0, t["straggler_last_share_chance_factor"] / max(n_ranks, 1)))


def _thresholds(n: int, t: Thresholds, min_cost: float) -> StragglerThresholds:
    """The values that decided, as the JSON shows them (`straggler_thresholds`); `min_cost_ms_per_step`:
    the cost bar in force (max of `min_cost_ms` and `min_cost_pct_of_step` of the median step)."""
    return StragglerThresholds(
        step_z_flag=t["straggler_step_z"], step_pct_flag=t["straggler_step_pct"], last_share_min=last_share_min(n, t),
        min_cost_pct_of_step=t["straggler_min_cost_pct_of_step"], min_cost_ms=t["straggler_min_cost_ms"],
        min_cost_ms_per_step=min_cost, cause_min_share=t["straggler_cause_min_share"],
        all_idle_pct=t["load_all_idle_pct"], wait_imbalance_pct=t["load_wait_imbalance_pct"])


def _step_table(ranks: Sequence[Collectives]) -> pl.DataFrame:
    rows: dict[str, list] = {"rank": [], "step": [], "duration_ms": [], "idle_ms": [], "exposed_ms": []}
    idle_idx = [CATEGORIES.index(c) for c in IDLE_CATEGORIES]
    exposed = CATEGORIES.index("comm_exposed")
    for rc in ranks:
        bd = breakdown_matrix(rc) if rc.step_breakdown_ns else np.zeros((len(rc.steps), len(CATEGORIES)), np.int64)
        for i, (s, a, b) in enumerate(zip(rc.steps, rc.step_start_ns, rc.step_end_ns)):
            rows["rank"].append(rc.rank)
            rows["step"].append(s)
            rows["duration_ms"].append((b - a) / NS_PER_MS)
            rows["idle_ms"].append(float(bd[i, idle_idx].sum()) / NS_PER_MS if i < len(bd) else 0.0)
            rows["exposed_ms"].append(float(bd[i, exposed]) / NS_PER_MS if i < len(bd) else 0.0)
    return pl.DataFrame(rows, schema={"rank": pl.Int64, "step": pl.Int64, "duration_ms": pl.Float64,
                                      "idle_ms": pl.Float64, "exposed_ms": pl.Float64})


def find_stragglers(ranks: Sequence[Collectives], table: CollectiveTable | None = None,
                    clock: ClockAlignment | None = None, members: pl.DataFrame | None = None,
                    thresholds: Thresholds | None = None, pipeline: Pipeline | None = None) -> StragglerReport:
    """Straggler verdict, per-rank figures and load balance (module docstring). `members`:
    `member_frame(ranks)` when the caller has it and no `table` (the collectives are matched here);
    `thresholds`: the values in force, by default `resolve()`; `pipeline`: the job's pipeline, whose
    unbalanced bottleneck stage is the cause of a straggler on it."""
    t = resolve(thresholds)
    ranks = sorted(ranks, key=lambda r: r.rank)
    n = len(ranks)
    if table is None:
        members = members if members is not None else member_frame(ranks)
        clock = clock or estimate_clock_offsets(ranks, members)
        table = match_collectives(ranks, applied_offsets(clock), members)
    steps = _step_table(ranks)
    median_step = float(cast(float, steps["duration_ms"].median())) if steps.height else None

    # ---- step-time statistics
    per_rank = steps.group_by("rank").agg(pl.len().alias("n"), pl.col("duration_ms").mean().alias("mean"),
                                          pl.col("duration_ms").std(ddof=0).alias("std")).sort("rank")
    means = per_rank["mean"].to_numpy() if per_rank.height else np.zeros(0)
    job_mean = float(means.mean()) if len(means) else None
    job_std = float(means.std()) if len(means) else None
    common = steps.filter(pl.len().over("step") >= 2)
    slowest = common.sort(["step", "duration_ms", "rank"], descending=[False, True, False]) \
        .group_by("step", maintain_order=True).first()
    n_common_steps = slowest.height
    slowest_count = dict(slowest.group_by("rank").len().iter_rows())
    step_stats = {}
    for r, cnt, mean, std in per_rank.iter_rows():
        z = (mean - job_mean) / job_std if job_std and job_std > 0 and n >= 2 else (0.0 if n >= 2 else None)
        pct = 100.0 * (mean - job_mean) / job_mean if job_mean else None
        outlier = n >= 3 and ((z is not None and z > t["straggler_step_z"])
                              or (pct is not None and pct > t["straggler_step_pct"]))
        step_stats[r] = (cnt, mean, std, (std / mean if mean else None), z, pct,
                         (slowest_count.get(r, 0) / n_common_steps if n_common_steps else None), bool(outlier))

    # ---- collective figures and verdict, in rounds: a straggler found is taken out and the
    # collectives re-matched among the others, so a second, smaller one hidden behind it shows
    min_cost = max(t["straggler_min_cost_ms"], t["straggler_min_cost_pct_of_step"] / 100.0 * (median_step or 0.0))
    # stragglers of later rounds are judged against the real job
    progress = _progress(table.members, int(t["straggler_queued_gap_us"] * NS_PER_US))
    stats, found = _evaluate(ranks, table, progress, step_stats, median_step, min_cost, t)
    by_rank = {s.rank: s for s in stats}
    remaining = [rc for rc in ranks if not by_rank[rc.rank].straggler]
    rounds = 1
    while (found and table.count and rounds < t["straggler_max_rounds"]
           and len(remaining) >= t["straggler_min_ranks_next_round"]):
        fixed = sorted(set(by_rank) - {rc.rank for rc in remaining})
        sub = _without(table, fixed)
        more_stats, more = _evaluate(remaining, sub, progress, step_stats, median_step, min_cost, t)
        if not more:
            break
        for st in more_stats:
            if st.straggler:
                st.found_in_round = rounds + 1
                by_rank[st.rank] = st
        for f in more:
            f.evidence += f" (once rank(s) {rank_list(fixed)} run like the median rank)"
        found += more
        remaining = [rc for rc in remaining if not by_rank[rc.rank].straggler]
        rounds += 1
    stats = [by_rank[rc.rank] for rc in ranks]
    if not table.count:
        _step_only(stats, ranks, found, t["straggler_cause_min_share"])
    # round by round (a later round's cost holds once the earlier ones are fixed), by cost within one
    found.sort(key=lambda s: (by_rank[s.rank].found_in_round, -s.cost_ms_per_step))
    _late_by_dim(found, ranks, table)
    _stage_stragglers(found, pipeline, t)
    balance = load_balance(ranks, bool(found), t)
    # the bar of the typical collective: 1 / its group's members is the chance of arriving last
    n_group = int(round(float(cast(float, table.collectives["n_ranks"].median())))) if table.count else n
    share_min = 100.0 * last_share_min(n_group, t)
    verdict = _verdict(found, stats, table.count, n, min_cost, share_min)
    return StragglerReport(stragglers=found, verdict=verdict, ranks=stats, load_balance=balance,
                           median_step_ms=median_step, thresholds=_thresholds(n_group, t, min_cost))


def _without(table: CollectiveTable, fixed: Sequence[int]) -> CollectiveTable:
    """The matched collectives as `match_collectives` gives them once the ranks `fixed` are taken
    out (the straggler search's later rounds), derived from `table` instead of re-matching the
    member frame: taking ranks out matches no new instance (a key's members only shrink), so the
    members are the table's rows of the other ranks, in the collectives that keep two of them.
    Only what the rounds read is recomputed (per collective: cid renumbered in `match_collectives`'
    order (start_min_ns, pg, seq, occ), step, start_max_ns, last_rank (ties: the higher rank),
    last_lead_ns; per member: cid, rank, idx, start_ns, wait_ns, is_last, step), with numpy
    reductions over each collective's rows. Re-matching (hashing, sorting and joining the whole
    member frame again each round) held ~12 MB more at 256 ranks x 336 collectives."""
    mem = table.members                    # sorted by (cid, rank)
    keep = ~np.isin(mem["rank"].to_numpy(), np.asarray(fixed, dtype=np.int64))
    cid = mem["cid"].to_numpy()[keep]
    count = np.bincount(cid, minlength=table.collectives.height)
    keep[keep] = count[cid] >= 2           # collectives that keep two members
    if not keep.any():
        return CollectiveTable(table.collectives.clear(), mem.clear(), dict(table.offsets_ns), unmatched=0)
    # the kept rows through polars (its allocator has the pages the matching freed), the per-row
    # figures with numpy on views of them
    sub = mem.select("cid", "rank", "idx", "start_ns", "step").filter(pl.Series(keep))
    del keep
    cid, rank, start, step = (sub[c].to_numpy() for c in ("cid", "rank", "start_ns", "step"))
    lo = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
    start_max = np.maximum.reduceat(start, lo)
    row_group = np.repeat(np.arange(len(lo)), np.diff(np.r_[lo, len(cid)]))
    at_max = start == start_max[row_group]
    last_rank = np.maximum.reduceat(np.where(at_max, rank, -1), lo)       # ties: the higher rank is last
    is_last = rank == last_rank[row_group]
    # the next-latest arrival: the latest start once the last arriver's row (one) is left out
    last_row = np.flatnonzero(at_max & is_last)
    last_row = last_row[np.r_[True, row_group[last_row][1:] != row_group[last_row][:-1]]]
    others = start.copy()
    others[last_row] = np.iinfo(np.int64).min
    second = np.maximum.reduceat(others, lo)
    del others, at_max
    per = pl.DataFrame({
        "old_cid": cid[lo], "start_min_ns": np.minimum.reduceat(start, lo), "step": np.maximum.reduceat(step, lo),
        "start_max_ns": start_max, "last_rank": last_rank, "last_lead_ns": start_max - second,
    }, schema_overrides={c: pl.Int64 for c in ("old_cid", "start_min_ns", "step", "start_max_ns", "last_rank",
                                              "last_lead_ns")})
    per = per.join(table.collectives.select(pl.col("cid").alias("old_cid"), "pg", "seq", "occ"), on="old_cid",
                   how="left")
    per = per.sort(["start_min_ns", "pg", "seq", "occ"]).with_row_index("cid").with_columns(
        pl.col("cid").cast(pl.Int64))
    renumber = np.zeros(table.collectives.height, dtype=np.int64)
    renumber[per["old_cid"].to_numpy()] = per["cid"].to_numpy()
    members = sub.select(pl.Series("cid", renumber[cid]), "rank", "idx", "start_ns",
                         (pl.Series(start_max[row_group]) - pl.col("start_ns")).alias("wait_ns"),
                         pl.Series("is_last", is_last), "step")
    del sub, cid, rank, start, step, row_group, is_last
    if not members["cid"].is_sorted():
        # rows keep their rank order within a collective: a stable sort on the new cid is (cid, rank)
        members = members.sort("cid", maintain_order=True)
    coll = per.select("cid", "step", "start_max_ns", "last_rank", "last_lead_ns")
    return CollectiveTable(coll, members, dict(table.offsets_ns), unmatched=0)


def _progress(mem: pl.DataFrame, queued_gap_ns: int) -> pl.DataFrame:
    """Per member instance (rank, idx): when its collective really started (`started_ns`: its last
    arrival) and how far the rank's own work had got by its end, within its step (`busy_ns`; null
    before any evidence): the running maximum of the ends of its own work during its collectives and
    of its arrivals that were not queued behind its previous collective (an arrival shows the rank
    was not ready earlier; a queued one only shows the queue: it came within `queued_gap_ns` of the
    end of the rank's previous collective)."""
    m = mem.sort(["rank", "start_ns"]).with_columns(
        pl.col("end_ns").cum_max().shift(1).over("rank").alias("prev_end_ns"))
    queued = (pl.col("start_ns") <= pl.col("prev_end_ns") + queued_gap_ns).fill_null(False)
    busy = (pl.when(pl.col("last_work_ns") > pl.col("start_ns")).then(pl.col("last_work_ns"))
            .when(~queued).then(pl.col("start_ns")))
    return m.select("rank", "idx", (pl.col("start_ns") + pl.col("wait_ns")).alias("started_ns"),
                    busy.cum_max().forward_fill().over(["rank", "step"]).alias("busy_ns"))


def _evaluate(ranks: Sequence[Collectives], table: CollectiveTable, progress: pl.DataFrame, step_stats: dict,
              median_step: float | None, min_cost: float, t: Thresholds) -> tuple[list[RankStats], list[Straggler]]:
    """One round: per-rank collective figures (vectorized; the what-if only for candidates) and the
    ranks that pass the straggler bars."""
    coll, mem = table.collectives, table.members
    n = len(ranks)
    # per-step figures are averaged over the steps that have collectives (collectives outside every
    # step window are matched and listed, but the what-if is per step)
    n_steps_with_coll = max(1, coll.filter(pl.col("step") >= 0)["step"].n_unique()) if coll.height else 1
    per, imposed, lead_share, group_n = {}, {}, {}, {}
    if mem.height:
        # chance of arriving last is 1 / members of the collective's group, not 1 / ranks of the job
        sizes = mem.group_by("cid").agg(pl.len().alias("n_ranks"))
        for r, g in mem.select("cid", "rank").join(sizes, on="cid").group_by("rank").agg(
                pl.col("n_ranks").median()).iter_rows():
            group_n[int(r)] = int(round(g))
        own_waits = _own_wait(mem, ranks, table.offsets_ns)
        for r, n_coll, n_last in mem.group_by("rank").agg(pl.len(), pl.col("is_last").sum()).iter_rows():
            per[int(r)] = (int(n_coll), int(n_last), float(own_waits.get(int(r), 0)))
        imposed = _imposed_wait(mem, coll)
        total_lead = float(coll["last_lead_ns"].sum())
        if total_lead > 0:
            lead_share = {int(r): 100.0 * float(v) / total_lead for r, v in
                          coll.group_by("last_rank").agg(pl.col("last_lead_ns").sum()).iter_rows()}

    def share(r: int) -> float:
        nc, nl, _ = per.get(r, (0, 0, 0.0))
        return max(100.0 * nl / nc if nc else 0.0, lead_share.get(r, 0.0))

    def bar(r: int) -> float:
        return 100.0 * last_share_min(group_n.get(r, n), t)

    # ties broken by rank: group_by order is arbitrary, and the result must not depend on it
    always = int(t["straggler_candidates"])
    picked = sorted(per, key=lambda r: (-per[r][1], r))[:always] + \
        sorted(lead_share, key=lambda r: (-lead_share[r], r))[:always] + \
        [r for r in per if share(r) >= bar(r)]
    candidates = set(r for r in picked if per.get(r, (0, 0, 0))[1] > 0)
    since_matrices: dict[int, np.ndarray] = {}        # each rank's, decompressed once (`since_step_rows`)
    step_starts = {rc.rank: {s: a - int(table.offsets_ns.get(rc.rank, 0)) for s, a in zip(rc.steps, rc.step_start_ns)}
                   for rc in ranks}
    # each member's progress, keyed by collective id
    mf = (mem.select("cid", "rank", "idx", "start_ns", "wait_ns").join(progress, on=["rank", "idx"])
          if candidates else None)
    stats: list[RankStats] = []
    found: list[Straggler] = []
    for rc in ranks:
        r = rc.rank
        cnt, mean, std, cv, z, pct, slow_share, outlier = step_stats.get(
            r, (0, None, None, None, None, None, None, False))
        n_coll, n_last, own_wait = per.get(r, (0, 0, 0.0))
        L = I = A = B = cost = lag = None
        excess, cause = {}, None
        if r in candidates:
            assert mf is not None             # made when there are candidates
            last_cids = coll.filter(pl.col("last_rank") == r)["cid"]
            L, I, A, B, cost, excess, cause, lag = _what_if(rc, ranks, coll, mf, last_cids, step_starts,
                                                            t["straggler_cause_min_share"], since_matrices)
            L, I, A, B, cost, lag = (x / n_steps_with_coll for x in (L, I, A, B, cost, lag))
            excess = {g: v / n_steps_with_coll for g, v in excess.items()}
        s = RankStats(
            rank=r, steps=cnt, step_time_mean_ms=mean, step_time_std_ms=std, step_time_cv=cv, step_time_z=z,
            step_time_pct_over_mean=pct, slowest_step_share=slow_share, step_time_outlier=outlier,
            collectives=n_coll, last_arrivals=n_last,
            last_arrival_pct=(100.0 * n_last / n_coll if n_coll else None),
            lateness_share_pct=lead_share.get(r, 0.0) if coll.height else None,
            wait_imposed_ms_per_step=imposed.get(r, 0.0) / n_steps_with_coll,
            own_wait_ms_per_step=own_wait / NS_PER_MS / n_steps_with_coll,
            lateness_ms_per_step=L, blocking_lateness_ms_per_step=I, work_excess_ms_per_step=A,
            others_wait_excess_ms_per_step=B,
            cost_ms_per_step=cost, excess_ms_per_step=excess, cause=cause, step_start_lag_ms_per_step=lag)
        stats.append(s)
        if coll.height and share(r) >= bar(r) and cost is not None and cost >= min_cost:
            s.straggler = True
            found.append(_straggler(s, coll, median_step, t["straggler_cause_min_share"]))
    return stats, found


def _straggler(s: RankStats, coll: pl.DataFrame, median_step: float | None, cause_min_share: float) -> Straggler:
    last_steps = sorted({int(x) for x in coll.filter(pl.col("last_rank") == s.rank)["step"].to_list() if x >= 0})
    evidence = (f"last to arrive at {s.last_arrivals} of {s.collectives} collectives ({s.last_arrival_pct:.0f}%, "
                f"{s.lateness_share_pct:.0f}% of all last-arrival lateness); each other rank waited "
                f"{s.wait_imposed_ms_per_step:.2f} ms per step for it (median); it did "
                f"{_top_excess(s.excess_ms_per_step)} more than the median rank before arriving; cost "
                f"{s.cost_ms_per_step:.2f} ms/step")
    cost, lag = s.cost_ms_per_step, s.step_start_lag_ms_per_step
    assert cost is not None and lag is not None     # a straggler was a candidate: its what-if was made
    if median_step:
        evidence += f" ({100 * cost / median_step:.1f}% of the median step)"
    if s.cause == "unknown" and s.lateness_ms_per_step and lag >= cause_min_share * s.lateness_ms_per_step:
        evidence += (f"; it started those steps {lag:.2f} ms/step after the median rank: "
                     f"the delay lies before the step's start (previous step, or before the profiled window), so "
                     f"its cause is not in this trace")
    return Straggler(rank=s.rank, cause=s.cause or "unknown", cost_ms_per_step=cost,
                     last_arrival_pct=s.last_arrival_pct, step_time_z=s.step_time_z,
                     step_time_pct_over_mean=s.step_time_pct_over_mean,
                     wait_imposed_ms_per_step=s.wait_imposed_ms_per_step, excess_ms_per_step=s.excess_ms_per_step,
                     steps=last_steps, evidence=evidence)


def _own_wait(mem: pl.DataFrame, ranks: Sequence[Collectives], offsets_ns: dict[int, int]) -> dict[int, int]:
    """Per rank: the time (ns) it waited in collectives for their last member inside its step
    windows, waits in concurrent collectives counted once (the union of its wait intervals)."""
    windows = pl.DataFrame(
        {"rank": [rc.rank for rc in ranks for _ in rc.steps], "step": [s for rc in ranks for s in rc.steps],
         "step_end_ns": [e - int(offsets_ns.get(rc.rank, 0)) for rc in ranks for e in rc.step_end_ns]},
        schema={"rank": pl.Int64, "step": pl.Int64, "step_end_ns": pl.Int64})
    w = mem.select("rank", "step", "start_ns", "wait_ns").filter(pl.col("wait_ns") > 0).join(
        windows, on=["rank", "step"]).sort("rank", "start_ns")
    if w.is_empty():
        return {}
    rank, a = w["rank"].to_numpy(), w["start_ns"].to_numpy()
    b = np.minimum(a + w["wait_ns"].to_numpy(), w["step_end_ns"].to_numpy())
    first = np.r_[True, rank[1:] != rank[:-1]]
    waited = union_length_per_group(a, np.maximum(a, b), np.cumsum(first) - 1)
    return dict(zip(rank[first].tolist(), waited.tolist()))


def _imposed_wait(mem: pl.DataFrame, coll: pl.DataFrame) -> dict[int, float]:
    """Per rank: the median over the other ranks of the time (ms, summed over steps) they waited in
    collectives where it arrived last; a rank's waits in concurrent collectives count once (per
    (last rank, waiting rank, step), the union of the wait intervals: `union_length_per_group`,
    instead of polars' `over` and group_by on (last rank, rank, step): in the straggler search's
    later rounds, where the last arrivals are spread over every rank, those groups number
    ~n^2 x steps, and their hash tables held ~25 MB at 256 ranks)."""
    last_of = np.zeros(int(cast(int, coll["cid"].max())) + 1 if coll.height else 0, dtype=np.int64)
    last_of[coll["cid"].to_numpy()] = coll["last_rank"].to_numpy()
    # rows selected and sorted by polars (its allocator has the pages the matching freed), the
    # unions with numpy on views of them
    w = mem.select(pl.Series("last", last_of[mem["cid"].to_numpy()]), "rank", "step", "start_ns", "wait_ns").filter(
        (pl.col("wait_ns") > 0) & (pl.col("rank") != pl.col("last"))).sort(["last", "rank", "step"])
    if w.is_empty():
        return {}
    last, rank, step, a = (w[c].to_numpy() for c in ("last", "rank", "step", "start_ns"))
    pair = np.r_[True, (last[1:] != last[:-1]) | (rank[1:] != rank[:-1])]
    group = np.cumsum(pair | np.r_[True, step[1:] != step[:-1]]) - 1
    waited = union_length_per_group(a, a + w["wait_ns"].to_numpy(), group)
    lo = np.flatnonzero(pair)                      # first row of each (last rank, waiting rank)
    # ns -> ms and the median in polars, as before (its division by a constant rounds differently)
    per_other = pl.DataFrame({"last_rank": last[lo], "ns": np.add.reduceat(waited, group[lo])},
                             schema_overrides={"last_rank": pl.Int64, "ns": pl.Int64})
    return {int(r): float(v) for r, v in
            per_other.group_by("last_rank").agg((pl.col("ns") / NS_PER_MS).median()).iter_rows()}


def _what_if(rc: Collectives, ranks: Sequence[Collectives], coll: pl.DataFrame, mf: pl.DataFrame,
             last_cids: pl.Series, step_starts: dict[int, dict[int, int]], cause_min_share: float,
             since_matrices: dict[int, np.ndarray]):
    """(L, I, A, B, cost, excess per group, cause, step-start lag), summed over the steps in which
    `rc` was last (ns converted to ms). Windows (read for the members of each step's K only): from
    each rank's step start to the straggler's arrival at K; the other members' part after their own
    arrival is their wait in K (communication). Lag: its step start minus the other members' median
    step start (aligned clocks)."""
    r = rc.rank
    mine_last = coll.filter(pl.col("cid").is_in(last_cids.implode()) & (pl.col("step") >= 0)).sort("start_max_ns")
    blocking_ns = _blocking(r, coll.filter(pl.col("step").is_in(mine_last["step"].implode())), mf)
    at_k = mf.filter(pl.col("cid").is_in(mine_last.group_by("step").agg(pl.col("cid").last())["cid"].implode()))
    cpu_only = rc.source == "host"
    comm = _GROUPS.index("communication")
    L = I = A = B = cost = lag = 0.0
    excess_total = np.zeros(len(_GROUPS))
    # each K's members: the rows of at_k by collective id (stable: in at_k's order)
    by_cid = np.argsort(at_k["cid"].to_numpy(), kind="stable")
    member_cid = at_k["cid"].to_numpy()[by_cid]
    member_rank = at_k["rank"].to_numpy()[by_cid]
    member_wait = at_k["wait_ns"].to_numpy()[by_cid].astype(np.float64)
    member_since = since_step_rows(ranks, member_rank, at_k["idx"].to_numpy()[by_cid], since_matrices).astype(
        np.float64)
    step_of, cid_of = mine_last["step"].to_numpy(), mine_last["cid"].to_numpy()
    arrival_of, lead_of = mine_last["start_max_ns"].to_numpy(), mine_last["last_lead_ns"].to_numpy()
    steps_seen, first_row = np.unique(step_of, return_index=True)
    for step in steps_seen[np.argsort(first_row)]:            # in order of first appearance
        rows = np.flatnonzero(step_of == step)
        # lateness: union of [next-latest arrival, its arrival] (concurrent collectives count once)
        arrival = arrival_of[rows]
        lateness = _union_length(arrival - lead_of[rows], arrival)
        blocking = blocking_ns.get(int(step), 0.0)
        lo, hi = np.searchsorted(member_cid, cid_of[rows[-1]], side="left"), np.searchsorted(
            member_cid, cid_of[rows[-1]], side="right")
        if lo == hi:
            continue
        rank = member_rank[lo:hi]
        mine = rank == r
        if mine.all() or not mine.any():
            continue
        since = member_since[lo:hi]
        mine_g = since[np.flatnonzero(mine)[0]] @ _GROUP_MATRIX
        oth_g = since[~mine] @ _GROUP_MATRIX
        oth_g[:, comm] += member_wait[lo:hi][~mine]
        ex = mine_g - np.median(oth_g, axis=0)
        a = float(np.clip(np.delete(ex, comm), 0, None).sum())
        b = float(max(-ex[comm], 0.0))
        other_starts = [x for x in (step_starts.get(int(o), {}).get(int(step)) for o in rank[~mine].tolist())
                        if x is not None]
        mine_start = step_starts.get(r, {}).get(int(step))
        if other_starts and mine_start is not None:
            lag += max(0.0, mine_start - float(np.median(other_starts)))
        L += lateness
        I += blocking
        A += a
        B += b
        cost += min(a, b, blocking)
        excess_total += ex
    excess = {g: float(v) / NS_PER_MS for g, v in zip(_GROUPS, excess_total)}
    if cpu_only:        # the training thread's ops are CPU ops on CPU-only jobs
        excess["cpu_ops"] = excess.get("cpu_ops", 0.0) + excess.pop("gpu_compute")
    positive = {g: v for g, v in excess.items() if v > 0}
    cause = "unknown"
    if positive and lag < cause_min_share * L:
        best = max(positive, key=positive.__getitem__)
        if positive[best] >= cause_min_share * sum(positive.values()):
            cause = best
    return L / NS_PER_MS, I / NS_PER_MS, A / NS_PER_MS, B / NS_PER_MS, cost / NS_PER_MS, excess, cause, lag / NS_PER_MS


def _blocking(r: int, step_colls: pl.DataFrame, mf: pl.DataFrame) -> dict[int, float]:
    """I per step (ns): over the step's collectives that `r` is a member of, the union of [every
    other member done with its own work so far, `r` done (arrived and its own work so far) but no
    later than the collective's real start]."""
    step_of = dict(zip(step_colls["cid"].to_list(), step_colls["step"].to_list()))
    m = mf.filter(pl.col("cid").is_in(step_colls["cid"].implode()))
    others_done: dict[int, int] = {}      # per collective: the latest `busy_ns` of its other members
    mine_done: dict[int, int] = {}
    for cid, rank, start, started, busy in zip(*(m[c].to_list() for c in ("cid", "rank", "start_ns", "started_ns",
                                                                          "busy_ns"))):
        if rank == r:
            mine_done.setdefault(cid, min(start if busy is None else max(start, busy), started))
        elif busy is not None:
            others_done[cid] = max(others_done.get(cid, busy), busy)
    per_step: dict[int, tuple[list[int], list[int]]] = {}
    for cid, done in mine_done.items():
        others, mine = per_step.setdefault(int(step_of[cid]), ([], []))
        others.append(others_done.get(cid, done))
        mine.append(done)
    return {step: _union_length(np.array(others, dtype=np.int64), np.array(mine, dtype=np.int64))
            for step, (others, mine) in per_step.items()}


def _union_length(a: np.ndarray, b: np.ndarray) -> float:
    s, e = union(a, b)
    return float((e - s).sum())


def _top_excess(excess: dict[str, float]) -> str:
    pos = sorted(((v, g) for g, v in excess.items() if v > 0), reverse=True)[:2]
    return ", ".join(f"{v:.2f} ms/step of {g}" for v, g in pos) if pos else "nothing"


def _step_only(stats: list[RankStats], ranks: Sequence[Collectives], found: list[Straggler],
               cause_min_share: float) -> None:
    """No matched collectives: a step-time outlier is the only evidence; its cause is the group in
    which its mean step breakdown exceeds the median of the other ranks most."""
    groups = {}
    for rc in ranks:
        bd = np.asarray(rc.step_breakdown_ns, dtype=np.float64).reshape(-1, len(CATEGORIES))
        if len(bd):
            groups[rc.rank] = bd.mean(axis=0) @ _GROUP_MATRIX / NS_PER_MS
    for s in stats:
        if not s.step_time_outlier or s.rank not in groups or len(groups) < 3:
            continue
        others = np.median(np.array([v for r, v in groups.items() if r != s.rank]), axis=0)
        ex = groups[s.rank] - others
        excess = {g: float(v) for g, v in zip(_GROUPS, ex)}
        positive = {g: v for g, v in excess.items() if v > 0}
        cause: StragglerCause = "unknown"
        if positive:
            best = max(positive, key=positive.__getitem__)
            cause = (cast(StragglerCause, best) if positive[best] >= cause_min_share * sum(positive.values())
                     else "unknown")
        cost = max(0.0, (s.step_time_mean_ms or 0.0) - float(np.median([x.step_time_mean_ms for x in stats
                                                                         if x.step_time_mean_ms is not None])))
        s.straggler, s.cause, s.cost_ms_per_step, s.excess_ms_per_step = True, cause, cost, excess
        found.append(Straggler(rank=s.rank, cause=cause, cost_ms_per_step=cost, last_arrival_pct=None,
                               step_time_z=s.step_time_z, step_time_pct_over_mean=s.step_time_pct_over_mean,
                               wait_imposed_ms_per_step=0.0, excess_ms_per_step=excess, steps=[],
                               evidence=f"no collectives matched across ranks; mean step time "
                                        f"{s.step_time_pct_over_mean:.1f}% over the mean (z = {s.step_time_z:.2f})"))


def _share(s: RankStats) -> float:
    """The last-arrival share a straggler needs (percent): of its collectives, or of the job's lateness."""
    return max(s.last_arrival_pct or 0.0, s.lateness_share_pct or 0.0)


def _verdict(found: list[Straggler], stats: list[RankStats], n_coll: int, n: int, min_cost: float,
             share_min: float) -> str:
    """One line that names the figures it compares: cost against `min_cost`, shares against `share_min`."""
    if found:
        named = "; ".join(f"rank {s.rank} is a straggler (cause {s.cause}, costs {s.cost_ms_per_step:.2f} ms/step "
                          f">= {min_cost:.2f}, last at {s.last_arrival_pct:.0f}% of collectives)"
                          if s.last_arrival_pct is not None else
                          f"rank {s.rank} is a straggler (cause {s.cause}, step time "
                          f"{s.step_time_pct_over_mean:.1f}% over the mean)" for s in found)
        return named + (f"; {COST_DEFINITION}" if any(s.last_arrival_pct is not None for s in found) else "")
    if n < 2:
        return "no straggler: fewer than two ranks"
    if not n_coll:
        return "no straggler: no collective matched across ranks and no step-time outlier"
    bar = (f"no rank that arrives last at >= {share_min:.0f}% of its collectives (or holds >= {share_min:.0f}% "
           f"of the last-arrival lateness)")
    late = [s for s in stats if _share(s) >= share_min and s.cost_ms_per_step is not None]
    if late:
        top = max(late, key=lambda s: (s.cost_ms_per_step, s.last_arrivals))
        return (f"no straggler: {bar} costs >= {min_cost:.2f} ms/step; highest cost: rank {top.rank}, "
                f"{top.cost_ms_per_step:.2f} ms/step (last at {top.last_arrival_pct or 0:.0f}%, "
                f"{top.lateness_share_pct or 0:.0f}% of the lateness; the others waited "
                f"{top.wait_imposed_ms_per_step:.2f} ms/step for it, median over them); {COST_DEFINITION}")
    top = max(stats, key=lambda s: (s.last_arrivals, _share(s)))
    cost = "" if top.cost_ms_per_step is None else f", cost {top.cost_ms_per_step:.2f} ms/step"
    return (f"no straggler: {bar.replace('no rank that arrives', 'no rank arrives')}; most often last: "
            f"rank {top.rank} (last at {top.last_arrival_pct or 0:.0f}%, {top.lateness_share_pct or 0:.0f}% of "
            f"the lateness{cost})")


def load_balance(ranks: Sequence[Collectives], has_straggler: bool, t: Thresholds) -> LoadBalance:
    """All ranks idle at once vs one rank late (module docstring)."""
    steps = _step_table(ranks)
    if steps.is_empty() or len(ranks) < 2:
        return LoadBalance([], None, None, "n/a", "fewer than two ranks with steps")
    s = steps.filter(pl.len().over("step") >= 2).with_columns(
        (100 * pl.col("idle_ms") / pl.col("duration_ms")).alias("idle_pct"))
    if s.is_empty():
        return LoadBalance([], None, None, "n/a", "no step common to two ranks")
    per_step = s.group_by("step").agg(
        pl.col("idle_pct").min().alias("common_idle_pct"),
        (100 * (pl.col("exposed_ms").median() - pl.col("exposed_ms").min()) / pl.col("duration_ms").median())
        .alias("wait_spread_pct"),
        pl.col("rank").sort_by(["exposed_ms", "rank"]).first().alias("least_waiting_rank"),
    ).sort("step")
    idle = float(cast(float, per_step["common_idle_pct"].mean()))
    spread = float(cast(float, per_step["wait_spread_pct"].mean()))
    figures = (f"every rank idle at once {idle:.1f}% of a step; the median rank sits in exposed communication "
               f"{spread:.1f}% of a step longer than the rank that waits least")
    verdict: LoadVerdict
    if has_straggler:
        verdict, summary = "one_rank_late", f"one rank late (see stragglers): {figures}"
    elif idle >= t["load_all_idle_pct"]:
        verdict, summary = "all_ranks_idle", (f"all ranks idle at the same time (input pipeline / host bound "
                                             f"everywhere, not one rank): {figures}")
    elif spread >= t["load_wait_imbalance_pct"]:
        verdict, summary = "rotating_lateness", (f"ranks wait for a late one, but no single rank is late "
                                                f"consistently (imbalance that moves): {figures}")
    else:
        verdict, summary = "balanced", f"balanced: {figures}"
    return LoadBalance([LoadBalanceStep(*row) for row in per_step.select(
        "step", "common_idle_pct", "wait_spread_pct", "least_waiting_rank").iter_rows()],
        idle, spread, verdict, summary)


def _late_by_dim(found: list[Straggler], ranks: Sequence[Collectives], table: CollectiveTable) -> None:
    """On a job of several dimensions, each straggler's evidence says in which dimension's groups it
    arrives last (a rank late inside its tp group is late there, not everywhere)."""
    dims_of = {rc.rank: rc.dim for rc in ranks}
    if not found or len({d for dims in dims_of.values() for d in dims if d}) < 2:
        return
    m = table.members
    for st in found:
        mine = m.filter(pl.col("rank") == st.rank)
        share: dict[str, tuple[int, int]] = {}
        for idx, last in mine.select("idx", "is_last").iter_rows():
            d = dims_of[st.rank][idx] if idx < len(dims_of[st.rank]) else ""
            n, k = share.get(d or "other", (0, 0))
            share[d or "other"] = (n + 1, k + int(last))
        if share:
            st.evidence += "; by dimension: " + ", ".join(
                f"last at {k} of {n} {d} collectives ({100.0 * k / n:.0f}%)" for d, (n, k) in sorted(share.items()))


def _stage_stragglers(found: list[Straggler], pipeline: Pipeline | None, t: Thresholds) -> None:
    """A straggler on the bottleneck stage of an unbalanced pipeline (compute >=
    `pipeline_stage_imbalance_pct` over the stages' mean) is late because its stage holds more work:
    cause `pipeline_stage`."""
    if pipeline is None or pipeline.bottleneck_stage is None or \
            pipeline.imbalance_pct_over_mean < t["pipeline_stage_imbalance_pct"]:
        return
    stage = next(st for st in pipeline.stages if st.stage == pipeline.bottleneck_stage)
    for s in found:
        if s.rank in stage.ranks:
            s.cause = "pipeline_stage"
            s.evidence += (f"; it is on pipeline stage {stage.stage}, which computes "
                           f"{pipeline.imbalance_pct_over_mean:.0f}% "
                           f"more than the stages' mean")
