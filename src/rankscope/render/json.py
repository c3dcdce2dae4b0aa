"""`analyze --json`: the stable `rankscope.analysis/1` object (docs/json-schema.md): the encoding of
the typed report (results/analysis.py `Analysis`) as it is. `Analysis.load` reads it back.

Its JSON Schema (src/rankscope/schemas/analysis.schema.json) is generated from the same types
(`analysis_schema`; the Structs' docstrings are the descriptions): after a change of the report's
types, `python -m rankscope.render.json > src/rankscope/schemas/analysis.schema.json` (a test keeps
the file equal to what this makes)."""
from __future__ import annotations

import sys
from typing import Any

import msgspec

from rankscope.render.base import JsonRenderer
from rankscope.render.format import json_bytes
from rankscope.results import Analysis


class AnalysisJson(JsonRenderer):
    """`analyze --json`: the `rankscope.analysis/1` object."""

    def to_dict(self, result: Analysis) -> dict[str, Any]:
        data: dict[str, Any] = msgspec.to_builtins(result, str_keys=True)
        return data

    def text(self, result: Analysis) -> str:
        return msgspec.json.format(json_bytes(result), indent=1).decode() + "\n"   # (a file name need not be UTF-8)


def analysis_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of `rankscope.analysis/1`, from the report's types."""
    generated = _one_line(msgspec.json.schema(Analysis))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "rankscope.analysis/1",
            "title": "rankscope analyze --json (schema rankscope.analysis/1)",
            "description": ("`rankscope analyze --json`, generated from the typed report (rankscope.results): "
                            "docs/json-schema.md explains each field. Fields may be added; the fields here "
                            "never change meaning."), **generated}


def _one_line(node: Any) -> Any:
    """The schema with each description (a Struct's docstring) on one line."""
    if isinstance(node, dict):
        return {k: " ".join(v.split()) if k == "description" and isinstance(v, str) else _one_line(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_one_line(v) for v in node]
    return node


def schema_text() -> str:
    """The schema file's text: the schema, indented by one space."""
    return msgspec.json.format(msgspec.json.encode(analysis_schema()), indent=1).decode() + "\n"


if __name__ == "__main__":
    sys.stdout.write(schema_text())
