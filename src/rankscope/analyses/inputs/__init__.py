"""Analyses of inputs other than profiler traces: NCCL debug logs, CUDA memory snapshots."""
