"""Build hook for the optional C parts: the column extractor (rankscope.ingest._fastcols), the
op nesting sweep (rankscope.analyses._nesting), interval union and sorted lookup
(rankscope.analyses._intervals) and the critical path's what-if re-timing
(rankscope.analyses._retime).

`optional=True`: where no C compiler is present the package still installs and the
pure-Python extractor in `rankscope.ingest.columns`, the numpy nesting in
`rankscope.analyses.rank.operators`, the numpy interval code in `rankscope.analyses.intervals`
and the Python re-timing in `rankscope.analyses.job.critical_path` are used instead.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rankscope.ingest._fastcols",
            sources=["src/rankscope/ingest/_fastcols.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "rankscope.analyses._nesting",
            sources=["src/rankscope/analyses/_nesting.c"],
            depends=["src/rankscope/analyses/_int64s.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "rankscope.analyses._intervals",
            sources=["src/rankscope/analyses/_intervals.c"],
            depends=["src/rankscope/analyses/_int64s.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "rankscope.analyses._retime",
            sources=["src/rankscope/analyses/_retime.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
    ]
)
