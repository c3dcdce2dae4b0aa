"""Collectives matched across ranks (the reduce over `RankCollectives`, analyses/rank/collectives.py).

Reduce side (docs/concepts.md "Collective"), over RankCollectives only (never event frames):
  `member_frame` one row per (rank, instance) with its match key (built once per reduce);
  `match_collectives` groups them:
  one logical collective = same (process group, seq) on every member; without seq, the n-th
  instance of that (process group, type) on each rank (send/recv/send_recv share type "p2p"; in a
  group of two ranks, sends and recvs by direction: the n-th send of one is the n-th recv of the other).
  Sends and recvs in a group where more than two ranks send or receive (a pipeline's stages in one
  group) are paired by time between neighbouring ranks instead (p2p.py): there each rank's seq and
  order count its traffic with every peer together.
  Per collective: arrival skew (max start - min start), last arriver, each member's wait (its start
  -> the last arriver's start), transfer = min duration across members (tb-profiler), bytes
  (nccl-tests size S), algbw = S / transfer and busbw = algbw x factor (`BUSBW_FACTOR`, from
  nccl-tests doc/PERFORMANCE.md "Summary": all_reduce 2(n-1)/n; reduce_scatter, all_gather,
  all_to_all (n-1)/n; broadcast, reduce, p2p 1). Timestamps are aligned with the clock offsets
  given (see clock.py) before any comparison across ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence, cast

import numpy as np
import polars as pl

from rankscope.analyses.job.p2p import pair_p2p
from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.analyses.rank.collectives import (P2P_PG, P2P_TYPES, SAME_SIZE_TYPES, busbw_factor,
                                          instances, nccl_tests_bytes, since_step_matrix)
from rankscope.results.collectives import Collectives
from rankscope.results.collectives import AlphaBetaFit, CollectiveGroupRow, CollectivesSummary
from rankscope.units import NS_PER_MS


def member_frame(ranks: Sequence[Collectives]) -> pl.DataFrame:
    """One row per (rank, instance), in (rank, idx) order: rank, idx, pg, seq, type, mtype, occ
    (match key: pg, seq, mtype, occ), start_ns / end_ns / last_work_ns on the rank's own clock,
    dur_ns, in_bytes, out_bytes, group_size, step, and `key` (a dense integer id of the match key,
    `_key_ids`). Built once per reduce: the clock estimate, the
    matching (which applies the offsets) and the straggler rounds share it. Columns are gathered
    across ranks with numpy and framed once, already in order, and `occ` is counted with numpy
    (`_occurrence`) instead of polars' sort and `over` on the whole frame: 256 ranks x 336
    instances, an 8 MB frame, 0.1 s and +33 MB RSS -> 0.02 s and +16 MB."""
    ranks = sorted((rc for rc in ranks if instances(rc)), key=lambda rc: rc.rank)
    if not ranks:
        return pl.DataFrame(schema={
            "rank": pl.Int64, "idx": pl.Int64, "pg": pl.String, "seq": pl.Int64, "type": pl.String,
            "orphan": pl.Boolean, "host_spans": pl.Boolean, "mtype": pl.String, "occ": pl.Int64,
            "start_ns": pl.Int64, "end_ns": pl.Int64, "dur_ns": pl.Int64, "last_work_ns": pl.Int64,
            "in_bytes": pl.Int64, "out_bytes": pl.Int64, "group_size": pl.Int64, "step": pl.Int64,
            "key": pl.Int64})

    def ints(get) -> np.ndarray:
        return np.concatenate([np.asarray(get(rc), dtype=np.int64) for rc in ranks])

    start, end = ints(lambda rc: rc.start_ns), ints(lambda rc: rc.end_ns)
    df = pl.DataFrame({
        "rank": ints(lambda rc: np.full(instances(rc), rc.rank)), "idx": ints(lambda rc: np.arange(instances(rc))),
        "pg": [v for rc in ranks for v in rc.pg], "seq": ints(lambda rc: rc.seq),
        "type": [v for rc in ranks for v in rc.type],
        "start_ns": start, "end_ns": end, "dur_ns": end - start,
        "last_work_ns": ints(lambda rc: rc.last_work_ns if len(rc.last_work_ns) == instances(rc) else rc.start_ns),
        "in_bytes": ints(lambda rc: rc.in_bytes), "out_bytes": ints(lambda rc: rc.out_bytes),
        "group_size": ints(lambda rc: rc.group_size), "step": ints(lambda rc: rc.step),
        "orphan": np.concatenate([np.asarray(rc.orphan if len(rc.orphan) == instances(rc) else [False] * instances(rc),
                                             dtype=bool)
                                  for rc in ranks]),
        "host_spans": np.concatenate([np.full(instances(rc), rc.source == "host") for rc in ranks]),
    }, schema_overrides={"pg": pl.String, "type": pl.String})
    if len({rc.rank for rc in ranks}) < len(ranks):        # two collections claim one rank
        df = df.sort(["rank", "idx"], maintain_order=True)
    with_seq = pl.col("seq") >= 0
    # without seq, host (gloo) instances of a same-size type are matched per input size too: gloo
    # runs collectives in flight at once (DDP buckets) on several threads, so their spans may start
    # in another order on each rank; one logical collective has one size on every member. Device
    # collectives run in issue order on their stream: there a size mismatch stays visible.
    by_size = pl.col("host_spans") & pl.col("type").is_in(SAME_SIZE_TYPES) & (pl.col("in_bytes") >= 0)
    df = df.with_columns(
        pl.when(with_seq).then(pl.lit("*"))
        .when(by_size).then(pl.col("type") + pl.lit(":") + pl.col("in_bytes").cast(pl.String))
        .otherwise(pl.col("type").replace_strict({t: "p2p" for t in P2P_TYPES}, default=pl.col("type")))
        .alias("mtype"))
    df = _p2p_directions(df)
    # occurrence: n-th instance of (pg, seq) with seq, of (pg, mtype) without, on each rank (by
    # arrival); orphans without seq are not matched (occ -1, unique per rank so never grouped)
    df = df.with_columns(pl.Series("occ", _occurrence(df), dtype=pl.Int64))
    unmatchable = pl.col("orphan") & ~with_seq
    df = df.with_columns(pl.when(unmatchable).then(pl.lit("orphan:") + pl.col("rank").cast(pl.String))
                         .otherwise(pl.col("mtype")).alias("mtype"))
    return df.with_columns(pl.Series("key", _key_ids(df), dtype=pl.Int64))


def _p2p_directions(df: pl.DataFrame) -> pl.DataFrame:
    """Sends and recvs without seq in a group of two ranks, typed by direction ("p2p:<from>><to>"):
    the n-th send of one rank is the n-th recv of the other (a pipeline stage sends activations
    and receives gradients in an order of its own, which its neighbour's order need not mirror)."""
    p2p = ((pl.col("mtype") == "p2p") & pl.col("type").is_in(["send", "recv"])).alias("p2p")
    mask = df.select(p2p)["p2p"].to_numpy()
    if not mask.any():
        return df
    rows = np.flatnonzero(mask)
    pg, rank, kind = (df[c].to_numpy()[rows] if c == "rank" else np.asarray(df[c].to_list(), dtype=object)[rows]
                      for c in ("pg", "rank", "type"))
    members: dict[str, set[int]] = {}
    for g, r in zip(pg.tolist(), rank.tolist()):
        members.setdefault(g, set()).add(r)
    mtype = df["mtype"].to_list()
    for i, g, r, k in zip(rows.tolist(), pg.tolist(), rank.tolist(), kind.tolist()):
        if len(members[g]) == 2:
            other = next(q for q in members[g] if q != r)
            mtype[i] = f"p2p:{r}>{other}" if k == "send" else f"p2p:{other}>{r}"
    return df.with_columns(pl.Series("mtype", mtype, dtype=pl.String))


def _key_ids(df: pl.DataFrame) -> np.ndarray:
    """Per row: a dense integer id of its match key (`KEY`: pg, seq, mtype, occ), numbered in the
    keys' sort order (strings ranked as polars sorts them), so that sorting or grouping by `key`
    orders rows exactly as by `KEY`. The stages after `member_frame` count, group and join on it
    instead of hashing or row-encoding the four columns, two of them strings, each time."""
    order, first = _sorted_groups(df, ["pg", "seq", "mtype", "occ"])
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = np.cumsum(first) - 1
    return ids


def _occurrence(df: pl.DataFrame) -> np.ndarray:
    """Per row (in (rank, idx) order): how many rows of the same (rank, pg, seq, mtype, orphan)
    come before it."""
    order, first = _sorted_groups(df, ["rank", "pg", "seq", "mtype", "orphan"])
    pos = np.arange(len(order))
    occ = np.empty(len(order), dtype=np.int64)
    occ[order] = pos - np.maximum.accumulate(np.where(first, pos, 0))
    return occ


def _sorted_groups(df: pl.DataFrame, columns: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """A stable sort of the rows by `columns` (strings by their dense rank, as polars sorts them;
    rows of one group keep their order) and, in that order, where each group starts."""
    codes = df.select(pl.col(c).rank("dense").cast(pl.Int64) if df[c].dtype == pl.String else pl.col(c).cast(pl.Int64)
                      for c in columns)
    keys = [codes[c].to_numpy() for c in codes.columns]
    del codes
    order = np.lexsort(keys[::-1])
    first = np.zeros(len(order), dtype=bool)
    first[:1] = True
    for k in keys:
        ks = k[order]
        first[1:] |= ks[1:] != ks[:-1]
    return order, first


KEY = ["pg", "seq", "mtype", "occ"]


def matched_rows(members: pl.DataFrame) -> np.ndarray:
    """Per member row: is its instance matched, i.e. does its `key` have at least two members."""
    key = members["key"].to_numpy()
    return np.bincount(key)[key] >= 2


def since_step_rows(ranks: Sequence[Collectives], rank: np.ndarray, idx: np.ndarray,
                    matrices: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """The `since_step_ns` window (ns per breakdown category, one column each) of the instances
    (rank, idx), one row each. `matrices`: each rank's `since_step_matrix()` once made, kept across
    calls (it is stored compressed)."""
    by_rank = {rc.rank: rc for rc in ranks}
    matrices = {} if matrices is None else matrices
    since = np.zeros((len(rank), len(CATEGORIES)), dtype=np.int64)
    for r in np.unique(rank).tolist():
        of_rank = rank == r
        if r not in matrices:
            matrices[r] = since_step_matrix(by_rank[r])
        since[of_rank] = matrices[r][idx[of_rank]]
    return since


@dataclass
class CollectiveTable:
    """Cross-rank collectives (docs/concepts.md "Collective").
    `collectives`: one row per logical collective: cid, pg, seq, type, step, n_ranks, group_size,
      complete (all group members present), start_min_ns / start_max_ns (aligned), skew_ns,
      last_rank, first_rank, last_lead_ns (last arrival - second-latest arrival), transfer_ns
      (min duration across members), bytes (nccl-tests S), algbw_gbps, busbw_gbps, end_spread_ns.
    `members`: one row per (collective, rank): cid, rank, idx (instance index on the rank),
      start_ns, end_ns, last_work_ns (aligned), dur_ns, wait_ns (own start -> last arriver's start),
      is_last, step.
    `offsets_ns`: the clock offsets applied (rank -> ns subtracted from its timestamps)."""
    collectives: pl.DataFrame
    members: pl.DataFrame
    offsets_ns: dict[int, int]
    unmatched: int                       # instances whose key no other rank has
    warnings: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return self.collectives.height


def match_collectives(ranks: Sequence[Collectives], offsets_ns: dict[int, int] | None = None,
                      members: pl.DataFrame | None = None) -> CollectiveTable:
    """Match instances across ranks by (pg, seq), or order within (pg, type) (module docstring).
    Only collectives seen on at least two ranks are kept. `members`: `member_frame(ranks)` when the
    caller has it (the rows of these ranks); the clock offsets are applied here."""
    offsets_ns = {int(k): int(v) for k, v in (offsets_ns or {}).items()}
    m = members if members is not None else member_frame(ranks)
    if any(offsets_ns.values()):
        off = pl.col("rank").replace_strict(offsets_ns, default=0, return_dtype=pl.Int64)
        m = m.with_columns(pl.col("start_ns") - off, pl.col("end_ns") - off, pl.col("last_work_ns") - off)
    if m.is_empty():
        return CollectiveTable(_empty_collectives(), _empty_members(), offsets_ns, 0)
    # only the columns read below, grouped on the integer `key` (same order as `KEY`): the member
    # frame is copied by the filter and the sort, so what it carries is paid for twice
    m = m.select("rank", "idx", "pg", "seq", "occ", "key", "type", "step", "group_size", "start_ns", "end_ns",
                 "dur_ns", "last_work_ns", "in_bytes", "out_bytes")
    m = _paired_p2p(m)
    matched = matched_rows(m)
    unmatched = int((~matched).sum())
    if not matched.all():
        m = m.filter(pl.Series(matched))
    del matched
    if m.is_empty():
        return CollectiveTable(_empty_collectives(), _empty_members(), offsets_ns, unmatched)
    # ranks that have each pg at all (the expected membership when group_size is unknown)
    ranks_per_pg = m.group_by("pg").agg(pl.col("rank").n_unique().alias("pg_ranks"))
    # sort members by arrival inside each collective: the last row is the last arriver (ties: lower rank first)
    # (a sorted copy of the columns the aggregation reads, dropped once it is done; the members'
    # rows below come from `m` as it is)
    by_arrival = m.select("key", "pg", "seq", "occ", "type", "step", "group_size", "start_ns", "end_ns", "dur_ns",
                          "rank", "in_bytes", "out_bytes").sort(["key", "start_ns", "rank"])
    g = by_arrival.group_by("key", maintain_order=True).agg(
        pl.col("pg").first(), pl.col("seq").first(), pl.col("occ").first(),
        pl.col("type").mode().sort().first().alias("type"),
        pl.col("step").max().alias("step"),
        pl.len().alias("n_ranks"),
        pl.col("group_size").max().alias("group_size_arg"),
        pl.col("start_ns").min().alias("start_min_ns"),
        pl.col("start_ns").max().alias("start_max_ns"),
        pl.col("start_ns").sort().slice(-2, 1).first().alias("second_start_ns"),
        pl.col("rank").last().alias("last_rank"),
        pl.col("rank").first().alias("first_rank"),
        pl.col("dur_ns").min().alias("transfer_ns"),
        pl.col("end_ns").min().alias("end_min_ns"),
        pl.col("end_ns").max().alias("end_max_ns"),
        pl.col("in_bytes").max().alias("in_bytes"),
        pl.col("out_bytes").max().alias("out_bytes"),
        pl.col("in_bytes").filter(pl.col("in_bytes") > 0).n_unique().alias("n_sizes"),
    ).join(ranks_per_pg, on="pg", how="left")
    del by_arrival
    g = g.sort(["start_min_ns", "pg", "seq", "occ"]).with_row_index("cid").with_columns(pl.col("cid").cast(pl.Int64))
    group = np.where(g["group_size_arg"].to_numpy() > 0, g["group_size_arg"].to_numpy(), g["pg_ranks"].to_numpy())
    types = g["type"].to_list()
    group = np.where(np.isin(types, P2P_TYPES), 2, group)        # a send and its recv: two members
    nbytes = np.array([nccl_tests_bytes(t, int(i), int(o), int(n)) for t, i, o, n in
                       zip(types, g["in_bytes"], g["out_bytes"], group)], dtype=np.int64)
    transfer = g["transfer_ns"].to_numpy().astype(np.float64)
    ok = (nbytes > 0) & (transfer > 0)
    algbw = np.where(ok, nbytes / np.where(transfer > 0, transfer, 1.0), np.nan)      # bytes/ns == GB/s
    factor = np.array([busbw_factor(t, int(n)) or np.nan for t, n in zip(types, group)])
    coll = g.select(
        "cid", "pg", "seq", "occ", "type", "step", "n_ranks",
        pl.Series("group_size", group.astype(np.int64)),
        (pl.col("n_ranks") >= pl.Series(group.astype(np.int64))).alias("complete"),
        "start_min_ns", "start_max_ns",
        (pl.col("start_max_ns") - pl.col("start_min_ns")).alias("skew_ns"),
        "last_rank", "first_rank",
        (pl.col("start_max_ns") - pl.col("second_start_ns")).alias("last_lead_ns"),
        "transfer_ns",
        (pl.col("end_max_ns") - pl.col("end_min_ns")).alias("end_spread_ns"),
        pl.Series("bytes", nbytes),
        pl.Series("algbw_gbps", algbw),
        pl.Series("busbw_gbps", algbw * factor),
        ((pl.col("n_sizes") > 1) & pl.col("type").is_in(SAME_SIZE_TYPES)).alias("size_mismatch"),
    )
    # each member's collective, looked up by key with numpy (what a join on `key` gives, without
    # its hash table and a copy of every column)
    by_key = np.zeros((3, int(cast(int, g["key"].max())) + 1), dtype=np.int64)
    by_key[:, g["key"].to_numpy()] = g.select("cid", "start_max_ns", "last_rank").to_numpy().T
    cid, start_max, last_rank = by_key[:, m["key"].to_numpy()]
    del by_key
    mem = m.select(
        pl.Series("cid", cid), "rank", "idx", "start_ns", "end_ns", "dur_ns", "last_work_ns",
        (pl.Series(start_max) - pl.col("start_ns")).alias("wait_ns"),
        (pl.col("rank") == pl.Series(last_rank)).alias("is_last"), "step",
    ).sort(["cid", "rank"])
    del cid, start_max, last_rank
    warnings = []
    by_order = coll.filter(pl.col("seq") < 0)
    bad = int(by_order["size_mismatch"].sum()) if by_order.height else 0
    if bad:
        warnings.append(f"{bad} of {by_order.height} collectives matched by order (no sequence numbers) have members "
                        f"with different sizes: the ranks' traces may not start at the same collective")
    return CollectiveTable(coll, mem, offsets_ns, unmatched, warnings)


def _paired_p2p(m: pl.DataFrame) -> pl.DataFrame:
    """The member rows with the sends and recvs of groups of more than two ranks (process group
    `P2P_PG<rank>@<group>`) keyed by their pair (`pair_p2p`; an instance left unpaired keeps a key
    of its own)."""
    is_p2p = m["pg"].str.starts_with(P2P_PG).to_numpy()
    if not is_p2p.any():
        return m
    rows = np.flatnonzero(is_p2p)
    sub = m[rows]
    pair = pair_p2p([g.split("@", 2)[-1] for g in sub["pg"].to_list()], sub["rank"].to_numpy(), sub["type"].to_list(),
                    sub["start_ns"].to_numpy(), sub["end_ns"].to_numpy())
    key = m["key"].to_numpy().copy()
    base = int(key.max()) + 1
    n_pairs = int(pair.max()) + 1 if (pair >= 0).any() else 0
    alone = pair == -1
    key[rows[pair >= 0]] = base + pair[pair >= 0]
    key[rows[alone]] = base + n_pairs + np.arange(int(alone.sum()))
    return m.with_columns(pl.Series("key", key, dtype=pl.Int64))


def _empty_collectives() -> pl.DataFrame:
    return pl.DataFrame(schema={
        "cid": pl.Int64, "pg": pl.String, "seq": pl.Int64, "occ": pl.Int64, "type": pl.String, "step": pl.Int64,
        "n_ranks": pl.UInt32, "group_size": pl.Int64, "complete": pl.Boolean, "start_min_ns": pl.Int64,
        "start_max_ns": pl.Int64, "skew_ns": pl.Int64, "last_rank": pl.Int64, "first_rank": pl.Int64,
        "last_lead_ns": pl.Int64, "transfer_ns": pl.Int64, "end_spread_ns": pl.Int64, "bytes": pl.Int64,
        "algbw_gbps": pl.Float64, "busbw_gbps": pl.Float64, "size_mismatch": pl.Boolean})


def _empty_members() -> pl.DataFrame:
    return pl.DataFrame(schema={"cid": pl.Int64, "rank": pl.Int64, "idx": pl.Int64, "start_ns": pl.Int64,
                                "end_ns": pl.Int64, "dur_ns": pl.Int64, "last_work_ns": pl.Int64, "wait_ns": pl.Int64,
                                "is_last": pl.Boolean, "step": pl.Int64})


def summarize_collectives(table: CollectiveTable, by: Sequence[str] = ("type", "group_size")) -> pl.DataFrame:
    """Per group (default: type and group size; ("pg",) for process groups): count, bytes,
    transfer and skew (ms), mean algbw / busbw (GB/s, over collectives with known bytes; a
    bytes-weighted mean: total bytes / total transfer time), and how often each rank was last."""
    c = table.collectives
    if c.is_empty():
        return pl.DataFrame(schema={**{k: c.schema[k] for k in by}, "count": pl.UInt32})
    known = pl.col("bytes") > 0
    out = c.group_by(list(by)).agg(
        pl.len().alias("count"),
        pl.col("n_ranks").max().alias("max_ranks"),
        pl.col("bytes").filter(known).sum().alias("total_bytes"),
        (pl.col("transfer_ns").sum() / NS_PER_MS).alias("transfer_ms"),
        (pl.col("skew_ns").mean() / NS_PER_MS).alias("skew_mean_ms"),
        (pl.col("skew_ns").max() / NS_PER_MS).alias("skew_max_ms"),
        (pl.col("bytes").filter(known).sum() / pl.col("transfer_ns").filter(known).sum()).alias("algbw_gbps"),
        (pl.col("busbw_gbps").filter(known).mean()).alias("busbw_mean_gbps"),
        pl.col("last_rank").mode().min().alias("most_often_last"),      # ties: the lowest rank
    ).sort(list(by))
    return out


def collectives_summary(table: CollectiveTable, alpha_beta: list[AlphaBetaFit]) -> CollectivesSummary:
    """The job's matched collectives: count, by type and group size, by process group, with the
    alpha-beta fits made of them."""
    c = table.collectives
    return CollectivesSummary(
        count=c.height, complete=int(c["complete"].sum()) if c.height else 0, unmatched_instances=table.unmatched,
        warnings=list(table.warnings),
        clock_offsets_ms={str(r): v / NS_PER_MS for r, v in sorted(table.offsets_ns.items())},
        by_type=_rows(summarize_collectives(table, ("type", "group_size"))),
        by_pg=_rows(summarize_collectives(table, ("pg",))), alpha_beta=alpha_beta)


def _rows(df: pl.DataFrame) -> list[CollectiveGroupRow]:
    """The rows of `summarize_collectives`, non-finite numbers as None."""
    return [CollectiveGroupRow(**cast(dict[str, Any], {k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                                                       for k, v in r.items()}))
            for r in df.to_dicts()]


def collective_waits(table: CollectiveTable, rank: int) -> pl.DataFrame:
    """The rank's waits in matched collectives (aligned clock): ts_ns (its arrival), dur_ns (until
    the last arriver's), last_rank, type, pg, seq, cid, step. Only waits > 0."""
    m = table.members.filter((pl.col("rank") == rank) & (pl.col("wait_ns") > 0))
    return m.join(table.collectives.select("cid", "type", "pg", "seq", "last_rank"), on="cid", how="left").select(
        pl.col("start_ns").alias("ts_ns"), pl.col("wait_ns").alias("dur_ns"), "last_rank", "type", "pg", "seq",
        "cid", "step").sort("ts_ns")
