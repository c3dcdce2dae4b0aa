"""Types of the C what-if re-timing of one step (_retime.c): C-contiguous int64 / float64 arrays."""
import numpy as np


def step(dep: np.ndarray, fixed: np.ndarray, window: np.ndarray, arrival: np.ndarray, duration: np.ndarray,
         last_member: np.ndarray, link: np.ndarray, offsets: np.ndarray, members: np.ndarray, transfer: np.ndarray,
         last: np.ndarray, start: np.ndarray, tail: np.ndarray, /) -> float: ...
