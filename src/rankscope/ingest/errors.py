"""The one error every input reader raises (Kineto JSON, Nsight SQLite, NCCL logs, memory snapshots)."""


class TraceError(Exception):
    """The file holds no usable input. The message is one line, without the file name."""
