"""rankscope: where every millisecond of every step went on every rank of a distributed job."""
__version__ = "0.1.0"

from rankscope.api import Analysis, Job, analyze, load  # noqa: E402
from rankscope.ingest import load_rank  # noqa: E402

__all__ = ["Analysis", "Job", "analyze", "load", "load_rank", "__version__"]
