"""Build hook for the optional C parts: the column extractor (rankscope.ingest._fastcols), the
op nesting sweep (rankscope.analyses._nesting), interval union and sorted lookup
(rankscope.analyses._intervals), the critical path's what-if re-timing
(rankscope.analyses._retime), the pickle pre-scan (rankscope.ingest._picklescan) and the Flight
Recorder dump reader (rankscope.ingest._frpickle).

`optional=True`: where no C compiler is present the package still installs and the
pure-Python extractor in `rankscope.ingest.columns`, the numpy nesting in
`rankscope.analyses.rank.operators`, the numpy interval code in `rankscope.analyses.intervals`,
the Python re-timing in `rankscope.analyses.job.critical_path`, the Python pre-scan in
`rankscope.ingest.safe_pickle` and the restricted unpickler for Flight Recorder dumps are used instead.
"""
from setuptools import Extension, setup


def _optional(module: str, source: str, depends: tuple[str, ...] = ()) -> Extension:
    return Extension(module, sources=[source], depends=list(depends), extra_compile_args=["-O3"], optional=True)


_INT64S = ("src/rankscope/analyses/_int64s.h",)

setup(
    ext_modules=[
        _optional("rankscope.ingest._fastcols", "src/rankscope/ingest/_fastcols.c"),
        _optional("rankscope.analyses._nesting", "src/rankscope/analyses/_nesting.c", _INT64S),
        _optional("rankscope.analyses._intervals", "src/rankscope/analyses/_intervals.c", _INT64S),
        _optional("rankscope.analyses._retime", "src/rankscope/analyses/_retime.c"),
        _optional("rankscope.ingest._picklescan", "src/rankscope/ingest/_picklescan.c"),
        _optional("rankscope.ingest._frpickle", "src/rankscope/ingest/_frpickle.c"),
    ]
)
