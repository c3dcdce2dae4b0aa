"""Capture helpers for live torch jobs (optional: `pip install 'rankscope[torch]'`).

    from rankscope.capture import rank_profiler, StragglerMonitor, ddp_bucket_sweep
    from rankscope.capture.calibrate import calibrate      # (`capture.calibrate` is the subpackage)

Every module imports torch inside its functions, so `import rankscope` (and this package) never
needs torch; calling a helper without torch raises `CaptureError` with the install line. The names
below load their module on first use.
"""
import importlib

_WHERE = {"CaptureError": "_torch", "rank_profiler": "profiler", "rank_trace_handler": "profiler",
          "StragglerMonitor": "monitor", "StragglerReport": "monitor",
          "ddp_bucket_sweep": "sweep", "BucketSetting": "sweep"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rankscope.capture' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rankscope.capture.{_WHERE[name]}"), name)
