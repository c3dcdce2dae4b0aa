"""The pipelines behind the commands: inputs -> ingest -> analyses -> findings -> one typed result
(`rankscope.results`) with the input problems met on the way. `rankscope.api` is their public face;
the CLI calls one per command.

    job.py      analyze, ingest (validate), load: the per-rank map, the cross-rank reduce
    driver_memory.py  what the driver does to keep its memory small while the ranks are mapped
    export.py   export_perfetto
    diff.py     diff_runs: two runs analysed and compared
    inputs.py   analyze_nccl_logs, analyze_memory_snapshots
    mfu.py      mfu: the model's FLOPs, the job's analysis, MFU / HFU
    (`calibrate` runs in a live job: capture.calibrate.calibrate_under_torchrun.)

A pipeline checks its arguments before it reads any file; a wrong one raises `ArgumentError`.
"""
from __future__ import annotations

import contextlib
from typing import Iterator


class ArgumentError(ValueError):
    """A pipeline's argument is wrong (an unknown threshold, incomplete model dims); raised before
    any file is read. The message is one line for the user."""


@contextlib.contextmanager
def checking_arguments() -> Iterator[None]:
    """Around a pipeline's argument checks: a ValueError they raise becomes an ArgumentError."""
    try:
        yield
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
