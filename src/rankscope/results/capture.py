"""Capture quality (docs/concepts.md "Capture quality"): whether the traces hold everything the job
did while it was profiled, and if not what is missing. Made by analyses/job/capture.py."""
from __future__ import annotations

from typing import Literal

import msgspec

#: What a capture issue is about (analyses/job/capture.py says each).
CaptureIssueKind = Literal["truncated", "dropped_values", "kernels_not_captured", "legacy_format", "no_steps",
                           "different_jobs", "clock_ranges_disjoint", "device_not_analysed",
                           "events_not_recognised", "not_a_capture", "ranks_missing"]


class CaptureIssue(msgspec.Struct):
    kind: CaptureIssueKind
    ranks: list[int]
    detail: str                # one line, plain words, with its numbers


class Capture(msgspec.Struct):
    """complete: no issue at all; partial: an issue that loses or mixes data; partial_ranks: the
    ranks whose data is incomplete (truncated, dropped values, kernels not captured);
    restated_warnings: the job warnings and input problems ("file: problem") that an issue says again
    (the reports list them once); coverage: "2 of 128 ranks present" when ranks are missing;
    headline: the report header's capture line (complete; complete with notes; or PARTIAL with how
    many issues)."""
    complete: bool
    partial: bool
    issues: list[CaptureIssue]
    partial_ranks: list[int]
    restated_warnings: list[str] = []
    coverage: str | None = None
    headline: str = ""
