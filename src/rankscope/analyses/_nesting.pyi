"""Types of the C op nesting sweep (_nesting.c): C-contiguous int64 arrays, outputs written in place."""
import numpy as np


def parents(g: np.ndarray, s: np.ndarray, e: np.ndarray, parent: np.ndarray, /) -> int: ...
def innermost(g: np.ndarray, s: np.ndarray, e: np.ndarray, parent: np.ndarray, qg: np.ndarray, qt: np.ndarray,
              out: np.ndarray, /) -> None: ...
