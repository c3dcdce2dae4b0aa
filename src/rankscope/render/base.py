"""One interface for every output: a `Renderer` writes one result in one format, and `render`
finds it by the result's type and the format's name.

    from rankscope.render.base import render
    render(analysis, "terminal", Console(highlight=False))   # a rich Console for "terminal"
    render(analysis, "json", sys.stdout)                     # a text stream for "json" and "html"

Renderers format and compute nothing. Terminal renderers print to a rich Console; text renderers
make the whole text with `text(result)`, which `render` writes; JSON renderers build their
schema's object with `to_dict(result)`. Options (the terminal analysis' `brief`) are the
renderer's constructor arguments.

`RENDERERS` names the renderer class of each (result type, format) as "module:Class", imported on
first use: a command loads only the renderer it writes with (the HTML ones bring plotly.js).

render/perfetto.py is no renderer: `export perfetto` streams a job's merged timeline into the
file rank by rank while the timeline is built from each rank's frames (api.export_perfetto), so
that memory holds one rank at a time. There is no result to hand over whole, and the file can
be gigabytes.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

import msgspec

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console


class Renderer(ABC):
    """One result type in one output format."""

    #: The format's name: "terminal", "json" or "html".
    format: ClassVar[str]
    #: The extension of a file that holds this output.
    output_file_extension: ClassVar[str]

    @abstractmethod
    def render(self, result: Any, out: Any) -> None:
        """Write `result` to `out`: a rich Console (terminal) or a text stream."""


class TerminalRenderer(Renderer):
    """Prints to a rich Console, readable at 80 columns."""

    format = "terminal"
    output_file_extension = "txt"

    @abstractmethod
    def render(self, result: Any, out: Console) -> None:
        """Print `result` on `out`."""


class TextRenderer(Renderer):
    """Writes its whole text to a text stream (stdout, a file)."""

    @abstractmethod
    def text(self, result: Any) -> str:
        """The whole output."""

    def render(self, result: Any, out: TextIO) -> None:
        out.write(self.text(result))


class JsonRenderer(TextRenderer):
    """One JSON object (its schema named in it), indented by one space."""

    format = "json"
    output_file_extension = "json"

    @abstractmethod
    def to_dict(self, result: Any) -> dict[str, Any]:
        """The schema's object: plain JSON data."""

    def text(self, result: Any) -> str:
        from rankscope.render.format import json_bytes
        return msgspec.json.format(json_bytes(self.to_dict(result)), indent=1).decode() + "\n"


class HtmlRenderer(TextRenderer):
    """One self-contained page that works offline."""

    format = "html"
    output_file_extension = "html"


#: (result type as "module.Class", format) -> its renderer as "module:Class".
RENDERERS: dict[tuple[str, str], str] = {
    ("rankscope.results.analysis.Analysis", "terminal"): "rankscope.render.terminal:AnalysisTerminal",
    ("rankscope.results.analysis.Analysis", "json"): "rankscope.render.json:AnalysisJson",
    ("rankscope.results.analysis.Analysis", "html"): "rankscope.render.html:AnalysisHtml",
    ("rankscope.results.Ingest", "terminal"): "rankscope.render.validate:ValidationTerminal",
    ("rankscope.results.Ingest", "json"): "rankscope.render.validate:ValidationJson",
    ("rankscope.results.DiffResult", "terminal"): "rankscope.render.diff_terminal:DiffTerminal",
    ("rankscope.results.DiffResult", "json"): "rankscope.render.diff_json:DiffJson",
    ("rankscope.results.DiffResult", "html"): "rankscope.render.diff_html:DiffHtml",
    ("rankscope.results.NcclResult", "terminal"): "rankscope.render.nccl:NcclTerminal",
    ("rankscope.results.NcclResult", "json"): "rankscope.render.nccl:NcclJson",
    ("rankscope.results.MemoryResult", "terminal"): "rankscope.render.memory_snapshot:MemoryTerminal",
    ("rankscope.results.MemoryResult", "json"): "rankscope.render.memory_snapshot:MemoryJson",
    ("rankscope.results.MfuResult", "terminal"): "rankscope.render.mfu:MfuTerminal",
    ("rankscope.results.MfuResult", "json"): "rankscope.render.mfu:MfuJson",
    ("rankscope.results.ThresholdList", "terminal"): "rankscope.render.thresholds:ThresholdsTerminal",
    ("rankscope.results.ThresholdList", "json"): "rankscope.render.thresholds:ThresholdsJson",
}


def renderer(result_type: type, fmt: str, **options: Any) -> Renderer:
    """The renderer of `result_type` (or of a base class of it) in format `fmt`, made with `options`;
    ValueError when there is none."""
    for cls in result_type.__mro__:
        where = RENDERERS.get((f"{cls.__module__}.{cls.__qualname__}", fmt))
        if where:
            module, _, name = where.partition(":")
            cls_: type[Renderer] = getattr(importlib.import_module(module), name)
            return cls_(**options)
    raise ValueError(f"no {fmt} output for {result_type.__name__}")


def render(result: Any, fmt: str, out: Any, **options: Any) -> None:
    """Write `result` in format `fmt` ("terminal", "json", "html") to `out`: a rich Console for
    "terminal", a text stream for the others."""
    renderer(type(result), fmt, **options).render(result, out)
