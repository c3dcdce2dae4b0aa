"""What is kept of a text that breaks: the events up to the last boundary that decodes, the trailer
after the event list at the end of the file, and the longest run of whole events before a cut."""
from __future__ import annotations

import msgspec

from rankscope.ingest.kineto.boundaries import _last_boundary
from rankscope.ingest.kineto.columns import _Accumulator
from rankscope.ingest.kineto.decode import _JSONError, _decode_span
from rankscope.ingest.kineto.events import _decode_any


def _decode_whole_events(buf: bytearray, acc: _Accumulator, lo: int) -> int | _JSONError | None:
    """Decode the events of buf up to its last event boundary (one whose '{' lies at or after `lo`:
    the ones before were tried by an earlier call); return where that is. A boundary can be a
    false one (`}, {` inside a string): the decode then fails at the cut, and the boundary before
    it is tried. A failure before the cut is a real error: returned, not raised.
    None: no usable boundary yet (the caller reads more)."""
    end = _last_boundary(buf, len(buf), lo)
    for _ in range(_MAX_BOUNDARY_TRIES):
        if end < 0:
            return None
        try:
            _decode_span(buf, end, acc)
            return end
        except _JSONError as exc:
            if exc.offset is not None and exc.offset < end - 1:
                return exc
        end = _last_boundary(buf, end - 1, lo)
    return None


_MAX_BOUNDARY_TRIES = 64


def _finish(buf: bytearray, acc: _Accumulator) -> dict | None:
    """At EOF: decode the last events and the trailer after the closing ']' (keys such as
    traceName or distributedInfo may follow the events). None if the ending is broken."""
    pos = len(buf)
    for _ in range(64):
        p = buf.rfind(b"]", 0, pos)
        if p <= 0:
            return None
        rest = bytes(buf[p + 1:]).strip()
        if rest in (b"", b"}"):
            trailer_text = b"{}"
        elif rest.startswith(b","):
            trailer_text = b"{" + rest[1:]
        else:
            trailer_text = None
        if trailer_text is not None:
            try:
                trailer = _decode_any(trailer_text)
            except (msgspec.DecodeError, RecursionError):
                pos = p
                continue
            try:
                _decode_span(buf, p, acc)
            except _JSONError:          # that ']' was inside the trailer (e.g. "INFO": [...])
                pos = p
                continue
            return trailer if isinstance(trailer, dict) else {}
        pos = p
    return None


def _salvage(buf: bytearray, acc: _Accumulator, limit: int | None = None) -> int:
    """Decode the longest run of whole events at the start of `buf` that ends before `limit`
    (where the text breaks, when known); return how many bytes were kept. Tries the ends of
    events ('}') from the back; each failed try tells where the text breaks, which bounds the
    next one, so a few tries suffice."""
    limit = len(buf) if limit is None else min(limit, len(buf))
    for _ in range(_MAX_SALVAGE_TRIES):
        close = buf.rfind(b"}", 0, limit)
        if close <= 0:
            return 0
        try:
            _decode_span(buf, close + 1, acc)
            return close + 1
        except _JSONError as exc:
            limit = close if exc.offset is None else min(close, exc.offset)
    return 0


_MAX_SALVAGE_TRIES = 2000
