"""Types of the C interval union and sorted lookup (_intervals.c): C-contiguous int64 arrays, outputs
written in place."""
import numpy as np


def union(starts: np.ndarray, ends: np.ndarray, order: np.ndarray, out_starts: np.ndarray, out_ends: np.ndarray, /
          ) -> int: ...
def find_sorted(keys: np.ndarray, values: np.ndarray, out: np.ndarray, /) -> None: ...
