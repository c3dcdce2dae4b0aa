"""rankscope: where every millisecond of every step went on every rank of a distributed job."""
from rankscope.version import __version__

__all__ = ["Analysis", "Job", "analyze", "load", "load_rank", "__version__"]


def __getattr__(name: str):
    # Lazy: `import rankscope.synth` (or the CLI's --help) does not pay for polars.
    if name in ("Analysis", "Job", "analyze", "load"):
        from rankscope import api
        return getattr(api, name)
    if name == "load_rank":
        from rankscope.ingest import load_rank
        return load_rank
    raise AttributeError(f"module 'rankscope' has no attribute {name!r}")
