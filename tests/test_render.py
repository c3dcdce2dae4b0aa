"""The renderer interface (render/base.py) and the shared formatting (render/format.py, numbers.py)."""
from __future__ import annotations

import importlib
import io

import pytest

from rankscope.numbers import rounded
from rankscope.render.base import RENDERERS, Renderer, render, renderer
from rankscope.render.format import number, p_value_text, percent, ranges, shortened, value_text
from rankscope.results import ThresholdList
from rankscope.thresholds import THRESHOLDS

from conftest import run_cli


@pytest.mark.parametrize("key", sorted(RENDERERS))
def test_every_registered_renderer_exists_for_its_result_type_and_format(key):
    result_type, fmt = key
    module, _, name = result_type.rpartition(".")
    assert isinstance(getattr(importlib.import_module(module), name), type)
    cls = type(renderer(getattr(importlib.import_module(module), name), fmt))
    assert issubclass(cls, Renderer) and cls.format == fmt and cls.output_file_extension
    assert RENDERERS[key] == f"{cls.__module__}:{cls.__name__}"


def test_a_format_without_renderer_is_refused():
    with pytest.raises(ValueError, match="no html output for ThresholdList"):
        renderer(ThresholdList, "html")


def test_json_renderer_writes_what_the_cli_prints(tmp_path):
    out = io.StringIO()
    render(ThresholdList(THRESHOLDS), "json", out)
    assert out.getvalue() == run_cli(["thresholds", "--json"], tmp_path).stdout


def test_shared_formatting():
    assert rounded(None, 2) is None and rounded(2, 1) == 2.0 and isinstance(rounded(2, 1), float)
    assert rounded(1.23456, 3) == 1.235
    assert number(None) == "-" and number(1234.56) == "1,234.6" and number(3.0, "+.1f", "%") == "+3.0%"
    assert number(None, missing="n/a") == "n/a" and number(12.5, ".0f") == "12"
    assert percent(None) == "n/a" and percent(12.345) == "12.3%"
    assert p_value_text(None) == "n/a" and p_value_text(0.0001) == "<0.001" and p_value_text(0.04) == "0.040"
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8" and ranges([]) == "-"
    assert shortened("void " + "k" * 60, 10) == "k" * 6 + "…" + "k" * 3 and shortened("gemm") == "gemm"
    assert value_text(None) == "–" and value_text(1234) == "1,234" and value_text(0.001) == "0.001"
    assert value_text({"a": 1.5, "b": [1, 2]}) == "a 1.50, b 1, 2"
