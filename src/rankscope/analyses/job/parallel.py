"""Everything the job's parallel layout tells (docs/concepts.md "Parallel layout"): the layout, the
communication per dimension, the pipeline and the expert load, from the ranks' RankCollectives."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

from rankscope.analyses.job.experts import ExpertLoad, expert_load
from rankscope.analyses.job.layout import Layout, RankDimComm, comm_by_dim, parallel_layout
from rankscope.analyses.job.pipeline import Pipeline, pipeline_analysis
from rankscope.analyses.rank.collectives import RankCollectives


@dataclass
class ParallelReport:
    layout: Layout
    comm: list[RankDimComm] = field(default_factory=list)
    pipeline: Pipeline | None = None
    experts: ExpertLoad | None = None

    def as_dict(self) -> dict:
        """The JSON contract (docs/json-schema.md "Parallel layout")."""
        return {
            "parallelism": {"layout": self.layout.text, "dims": [dataclasses.asdict(d) for d in self.layout.dims]},
            "pipeline": dataclasses.asdict(self.pipeline) if self.pipeline else None,
            "experts": ({"all_to_all_per_step": self.experts.all_to_all_per_step,
                         "groups": [dataclasses.asdict(g) for g in self.experts.groups]} if self.experts else None),
            "comm_by_dim_ms": {c.rank: {d: dataclasses.asdict(v) for d, v in c.by_dim.items()} for c in self.comm},
        }


def parallel_report(ranks: Sequence[RankCollectives]) -> ParallelReport:
    layout = parallel_layout(ranks)
    comm = comm_by_dim(ranks)
    return ParallelReport(layout, comm, pipeline_analysis(ranks, layout, comm), expert_load(ranks, layout))
