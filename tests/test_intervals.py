"""rankscope.analyses.intervals.union_length_per_group, by hand and against one `union` per group."""
from __future__ import annotations

import numpy as np

from rankscope.analyses.intervals import union, union_length_per_group


def test_union_length_per_group_by_hand():
    # group 0: [0,10) and [5,15) overlap -> 15; group 1: [100,110) and [120,125) -> 15; group 2: [3,4) -> 1
    starts = np.array([0, 5, 100, 120, 3])
    ends = np.array([10, 15, 110, 125, 4])
    assert union_length_per_group(starts, ends, np.array([0, 0, 1, 1, 2])).tolist() == [15, 15, 1]


def test_union_length_per_group_both_paths_equal_one_union_per_group():
    """Random intervals: the shifted single union, and the per-group path taken when the shifted
    times would not fit int64 (40 groups x a span of 2**58 ns), equal a `union` of each group alone."""
    rng = np.random.default_rng(3)
    group = np.sort(rng.integers(0, 40, 500))
    group = np.unique(group, return_inverse=True)[1]        # ids 0..G-1, no gaps
    for spread in (10_000, 2 ** 58):
        starts = rng.integers(0, spread, len(group))
        ends = starts + rng.integers(1, max(500, spread // 100), len(group))
        expected = [int(np.diff(np.stack(union(starts[group == g], ends[group == g])), axis=0).sum())
                    for g in range(group.max() + 1)]
        assert union_length_per_group(starts, ends, group).tolist() == expected
