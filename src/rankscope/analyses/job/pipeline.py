"""Pipeline parallelism: stages, microbatches, schedule, bubble and the bottleneck stage
(docs/concepts.md "Pipeline").

Reduce over the ranks' `RankCollectives` and the job's `Layout` (analyses/job/layout.py):
  - stage of a rank = its position in its pp group (ranks in order);
  - microbatches m: the point-to-point sends per step of the first stage (it sends one activation
    per microbatch and receives one gradient); on a pipeline of three or more stages, a middle
    stage then sends and receives twice as many. When the first stage talks as much as a middle one,
    each rank holds several model chunks: an interleaved schedule (m unknown from the traffic).
    The schedule's own marks, where the trace has them (`PIPELINE_MARKS` of
    analyses/rank/collectives.py: torch.distributed.pipelining's `PP:<stage>F<microbatch>` and
    `Forward <microbatch>`), give m and the model chunks per rank v exactly;
  - schedule: "gpipe" when, in every step, the last stage receives all its activations before it
    sends its first gradient (the first stage all its sends before its first receive, where the
    last stage has no traffic); "1f1b" when they alternate; "interleaved" as above;
    "unknown" when the first stage has no point-to-point traffic;
  - per stage: compute ms per step (compute running, alone or beside communication: the step
    breakdown's compute + comm_overlapped), and the bubble: the time the stage waits on its pipeline
    neighbours with nothing to compute (the pp dimension's exposed communication), % of the step;
  - theory: the idle share of a pipeline of p equal stages and m microbatches, (p-1)/(m+p-1) for
    GPipe and 1F1B, (p-1)/(v m+p-1) interleaved with v chunks per rank (Narayanan et al. 2021,
    "Efficient Large-Scale Language Model Training on GPU Clusters using Megatron-LM", section 2.2);
  - bottleneck stage: the one with the most compute; the pipeline runs at its pace, so an even
    split would cut the step by about step x (1 - mean / max) of the stages' compute.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from rankscope.analyses.job.layout import dim_named
from rankscope.results.layout import Layout, RankDimComm
from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.analyses.rank.collectives import breakdown_matrix
from rankscope.results.collectives import Collectives
from rankscope.units import NS_PER_MS
from rankscope.results.pipeline import Pipeline, PipelineSchedule, Stage

_COMP = (CATEGORIES.index("compute"), CATEGORIES.index("comm_overlapped"))


def pipeline_analysis(ranks: Sequence[Collectives], layout: Layout, comm: Sequence[RankDimComm]) -> Pipeline | None:
    """The job's pipeline (module docstring); None when it has no pp dimension."""
    pp = dim_named(layout, "pp")
    if pp is None or pp.size < 2:
        return None
    by_rank = {rc.rank: rc for rc in ranks}
    comm_of = {c.rank: c for c in comm}
    p = pp.size
    stage_ranks = [[g[s] for g in pp.groups if len(g) == p and g[s] in by_rank] for s in range(p)]
    stages = []
    for s, members in enumerate(stage_ranks):
        if not members:
            continue
        compute, bubble, step = [], [], []
        for r in members:
            rc = by_rank[r]
            bd = breakdown_matrix(rc)
            n = max(len(bd), 1)
            compute.append(float(bd[:, list(_COMP)].sum()) / NS_PER_MS / n)
            step.append(float(bd.sum()) / NS_PER_MS / n)
            pp_comm = comm_of[r].by_dim.get("pp") if r in comm_of else None
            bubble.append(pp_comm.exposed if pp_comm else 0.0)
        step_ms = float(np.mean(step))
        b = float(np.mean(bubble))
        stages.append(Stage(s, members, round(float(np.mean(compute)), 3), round(b, 3),
                            round(100.0 * b / step_ms, 2) if step_ms > 0 else 0.0, round(step_ms, 3)))
    schedule, m = _schedule(stage_ranks, by_rank, p)
    marks = [(by_rank[r].pipeline_stages, by_rank[r].pipeline_microbatches) for st in stage_ranks for r in st
             if by_rank[r].pipeline_microbatches > 0]
    chunks = int(np.median([v for v, _ in marks])) if marks else 1
    if marks:                      # the schedule's own marks count the microbatches exactly
        m = int(np.median([mb for _, mb in marks]))
    if chunks > 1:
        schedule = "interleaved"
    out = Pipeline(schedule, m, stages, stages_per_rank=chunks)
    if not stages:
        return out
    out.step_ms = round(float(np.mean([st.step_ms for st in stages])), 3)
    out.bubble_pct = round(float(np.mean([st.bubble_pct for st in stages])), 2)
    if m and schedule in ("gpipe", "1f1b", "interleaved"):
        out.bubble_pct_theory = round(100.0 * (p - 1) / (chunks * m + p - 1), 2)
    comp = np.array([st.compute_ms_per_step for st in stages])
    if comp.max() > 0:
        worst = int(np.argmax(comp))
        out.bottleneck_stage = stages[worst].stage
        out.imbalance_pct_over_mean = float(round(100.0 * (comp.max() / comp.mean() - 1.0), 2))
        out.balanced_step_saving_ms = float(round(out.step_ms * (1.0 - comp.mean() / comp.max()), 3))
    return out


def _schedule(stage_ranks: list[list[int]], by_rank: dict[int, Collectives], p: int
              ) -> tuple[PipelineSchedule, int | None]:
    """(schedule, microbatches) from the point-to-point traffic per step (module docstring)."""
    def per_step(r: int) -> dict[int, list[str]]:
        rc = by_rank[r]
        out: dict[int, list[str]] = {}
        for d, t, st in zip(rc.dim, rc.type, rc.step):
            if d == "pp" and st >= 0 and t in ("send", "recv"):
                out.setdefault(int(st), []).append(t)
        return out

    first = [per_step(r) for r in stage_ranks[0]] if stage_ranks and stage_ranks[0] else []
    sends = [seq.count("send") for steps in first for seq in steps.values()]
    if not sends or max(sends) == 0:
        return "unknown", None
    m = int(np.median(sends))
    if p >= 3 and stage_ranks[1]:
        middle = [seq.count("send") for r in stage_ranks[1] for seq in per_step(r).values()]
        if middle and np.median(middle) < 1.5 * m:
            return "interleaved", None
    # the last stage tells GPipe from 1F1B even with m <= p (where the first stage's warm-up holds
    # every forward): under GPipe it receives every activation before it sends its first gradient
    last = [per_step(r) for r in stage_ranks[-1]] if stage_ranks[-1] else []
    seqs = [seq for steps in last for seq in steps.values() if "send" in seq and "recv" in seq]
    if seqs:
        gpipe = all(_all_before(seq, "recv", "send") for seq in seqs)
    else:
        gpipe = all(_all_before(seq, "send", "recv") for steps in first for seq in steps.values())
    return ("gpipe" if gpipe else "1f1b"), m


def _all_before(seq: list[str], first: str, then: str) -> bool:
    """Every `first` of the sequence comes before its first `then`."""
    last_first = max((i for i, t in enumerate(seq) if t == first), default=-1)
    first_then = min((i for i, t in enumerate(seq) if t == then), default=len(seq))
    return last_first < first_then
