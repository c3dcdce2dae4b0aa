"""rankscope.analyses.intervals: union_length_per_group by hand and against one `union` per group;
the C union and sorted lookup against the numpy ones."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rankscope.analyses import intervals
from rankscope.analyses.intervals import find_sorted, union, union_length_per_group


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


_c_built = pytest.mark.skipif(intervals._c_intervals is None,
                              reason="built without a C compiler: only the numpy code exists")


@_c_built
@settings(max_examples=300, deadline=None)
@example(spans=[(5, 3), (0, 5), (5, 0), (9, -2)])       # touching, empty and negative intervals
@given(spans=st.lists(st.tuples(st.integers(-50, 200), st.integers(-10, 60)), max_size=80))
def test_c_union_is_the_numpy_union(spans):
    """The C pass (built at install) merges like the numpy code: random starts and lengths,
    overlapping, nested, touching, equal, empty and negative intervals, in any order."""
    starts = np.array([s for s, _ in spans], dtype=np.int64)
    ends = starts + np.array([d for _, d in spans], dtype=np.int64)
    c, ref = union(starts, ends), union(starts, ends, use_c=False)
    assert c[0].tolist() == ref[0].tolist() and c[1].tolist() == ref[1].tolist()
    assert c[0].dtype == ref[0].dtype == np.int64


@_c_built
@settings(max_examples=300, deadline=None)
@example(keys=[1, 3, 3, 3, 9], values=[3, 9, 10, 3, 0, 4])       # repeated keys, past the end, going back
@given(keys=st.lists(st.integers(-20, 200), max_size=80), values=st.lists(st.integers(-30, 230), max_size=60))
def test_c_find_sorted_is_the_numpy_find_sorted(keys, values):
    """The C lookup (it gallops forward through ascending values) finds what numpy's bisection
    finds, the first of repeated keys included: values in any order, ascending, and descending."""
    k = np.sort(np.array(keys, dtype=np.int64))
    for asked in (values, sorted(values), sorted(values, reverse=True)):
        v = np.array(asked, dtype=np.int64)
        assert find_sorted(k, v).tolist() == find_sorted(k, v, use_c=False).tolist()
