"""Build hook for the optional C column extractor (rankscope.ingest._fastcols).

`optional=True`: where no C compiler is present the package still installs and
the pure-Python extractor in `rankscope.ingest.columns` is used instead.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rankscope.ingest._fastcols",
            sources=["src/rankscope/ingest/_fastcols.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
