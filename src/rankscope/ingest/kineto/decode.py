"""Decoding a chunk of whole events: the C scanner first, msgspec where it declines, and the lenient
repairs (badly typed fields, NaN / Infinity literals, lone surrogates, invalid UTF-8) where msgspec
refuses; `_JSONError` says where the text breaks."""
from __future__ import annotations

import re
from decimal import Decimal

import msgspec
import numpy as np

from rankscope.ingest.kineto.columns import _Accumulator
from rankscope.ingest.kineto.events import (_NOT_A_NUMBER, Event, _decode_any, _decode_events, _decode_raw_list,
                                            _decode_raw_times, _decode_time)


class _JSONError(Exception):
    """The chunk is not valid JSON; `offset`: where it breaks, when known (bytes into the chunk)."""

    def __init__(self, offset: int | None):
        super().__init__(offset)
        self.offset = offset


_MSGSPEC_BYTE = re.compile(r"byte (\d+)")
#: A \uD800-\uDFFF escape that is not half of a surrogate pair (after an even run of backslashes).
_LONE_SURROGATE = re.compile(
    rb"(?<!\\)((?:\\\\)*)(?:\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})")


#: A non-JSON literal where msgspec stops (NaN, Infinity; in -Infinity, after the "-"); and a JSON
#: string, or NaN / Infinity / -Infinity outside strings (group 1).
_CONSTANT = re.compile(rb"Infinity|NaN")
_STRING_OR_CONSTANT = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|(-?Infinity|NaN)', re.DOTALL)


def _blank_constants(text: bytes) -> bytes:
    """Each NaN, Infinity, -Infinity outside strings as `[]` padded to its length (byte offsets
    hold): a ts or dur that is not a number, elsewhere a value of the wrong type (the default)."""
    return _STRING_OR_CONSTANT.sub(lambda m: m[0] if m[1] is None else b"[]".ljust(len(m[0])), text)


#: Levels of arrays and objects read in an event list; a value opened deeper is read as `[]`.
MAX_NESTING = 64
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def _flatten_deep(text: bytes) -> tuple[bytes, int]:
    """`text` with each array or object that opens deeper than MAX_NESTING levels written as `[]`
    padded to its length (byte offsets hold: a value of the wrong type, the default), and how many
    were. One pass of numpy over the bytes, outside strings: no recursion, whatever the depth."""
    b = np.frombuffer(text, np.uint8)
    edges = np.zeros(len(b) + 1, np.int32)
    for m in _JSON_STRING.finditer(text):
        edges[m.start()] += 1
        edges[m.end()] -= 1
    outside = np.cumsum(edges[:-1]) == 0
    opens = ((b == 0x5B) | (b == 0x7B)) & outside
    closes = ((b == 0x5D) | (b == 0x7D)) & outside
    depth = np.cumsum(opens.astype(np.int64) - closes)          # after each byte
    starts = np.flatnonzero(opens & (depth == MAX_NESTING + 1))
    ends = np.flatnonzero(closes & (depth == MAX_NESTING))
    at = np.searchsorted(ends, starts)
    starts, ends = starts[at < len(ends)], ends[at[at < len(ends)]]
    out = bytearray(text)
    for start, end in zip(starts.tolist(), ends.tolist()):
        out[start:end + 1] = b"[]".ljust(end + 1 - start)
    return bytes(out), len(starts)


def _decode_chunk(body: bytes | memoryview, acc: _Accumulator) -> None:
    """Decode the JSON array `body` (whole events only): C scanner first; msgspec where the
    scanner declines (it is the reference); badly typed events repaired one by one.
    Raises _JSONError for invalid JSON."""
    stopped = acc.scan(body)
    if stopped is None:
        return
    try:
        try:
            events = _decode_events(body)
        except msgspec.ValidationError:    # a badly typed event; the JSON may still break later
            events = _decode_leniently(bytes(body), acc)
    except msgspec.DecodeError as exc:
        if "surrogates" not in acc.repairing and _LONE_SURROGATE.search(body):
            # valid JSON that msgspec refuses: read it as the scanner does ("?" for each, as in
            # the frames' categories), same length, so byte offsets still hold
            return _decode_repaired(_LONE_SURROGATE.sub(rb"\1\\u003f", bytes(body)), "surrogates", acc)
        m = _MSGSPEC_BYTE.search(str(exc))
        at = int(m.group(1)) if m else None
        if "constants" not in acc.repairing and at is not None and _CONSTANT.match(body, at):
            # NaN / Infinity / -Infinity (Python's json writes them): each a value that is not a number
            return _decode_repaired(_blank_constants(bytes(body)), "constants", acc)
        raise _JSONError(at if at is not None else (stopped if stopped >= 0 else None)) from None
    except UnicodeDecodeError:             # invalid UTF-8 in a string: keep the events, mark the bytes
        if "utf8" in acc.repairing:
            raise _JSONError(None) from None
        acc.invalid_utf8_chunks += 1
        return _decode_repaired(bytes(body).decode("utf-8", "replace").encode("utf-8"), "utf8", acc)
    except RecursionError:                 # nested deeper than the decoder's stack: the deep values go
        if "nesting" in acc.repairing:
            raise _JSONError(None) from None
        text, n = _flatten_deep(bytes(body))
        acc.deep_values += n
        return _decode_repaired(text, "nesting", acc)
    acc.add(events)


def _decode_repaired(text: bytes, repair: str, acc: _Accumulator) -> None:
    """Decode a chunk again from its repaired text; a repair is tried at most once per chunk."""
    acc.repairing.add(repair)
    try:
        _decode_chunk(text, acc)
    finally:
        acc.repairing.discard(repair)


def _decode_span(buf: bytearray, end: int, acc: _Accumulator) -> None:
    """Decode the events in buf[1:end]. buf[0] is the '[' or ',' before the first event; it and
    buf[end] are set to '[' and ']' for the decode (no copy of the text) and restored after."""
    first = buf[0]
    last = buf[end] if end < len(buf) else None
    buf[0] = 0x5B
    if last is None:
        buf.append(0x5D)
    else:
        buf[end] = 0x5D
    try:
        with memoryview(buf) as view, view[:end + 1] as body:
            _decode_chunk(body, acc)
    finally:
        buf[0] = first
        if last is None:
            del buf[end:]
        else:
            buf[end] = last


def _decode_leniently(data: bytes, acc: _Accumulator) -> list:
    """Event by event. A ts or dur that is not a number is kept as NaN (the event is dropped, with
    its reason, when the frames are built); a badly typed `args` is dropped (a repaired event)."""
    events = []
    for raw in _decode_raw_list(data):
        text = b"[" + bytes(raw) + b"]"
        try:
            events.append(_decode_events(text)[0])
            continue
        except msgspec.ValidationError:
            pass
        try:
            loose = _decode_raw_times(text)[0]
            fields = {f: getattr(loose, f) for f in Event.__struct_fields__}
            events.append(Event(**{**fields, "ts": _time(loose.ts), "dur": _time(loose.dur)}))
            continue
        except msgspec.ValidationError:
            pass
        obj = _decode_any(bytes(raw))
        if not isinstance(obj, dict):
            acc.bad_events += 1
            continue
        for key in ("ts", "dur"):
            if obj.get(key) is not None:
                obj[key] = _time(msgspec.json.encode(obj[key]))
        args = obj.get("args")
        if not isinstance(args, dict):
            obj.pop("args", None)
        else:
            obj["args"] = {k: v for k, v in args.items() if k not in ("Input Dims", "Input type")}
        try:
            events.append(msgspec.convert(obj, Event, strict=False))
            acc.repaired_events += 1
        except msgspec.ValidationError:
            acc.bad_events += 1
    return events


def _time(raw: msgspec.Raw | bytes | None) -> Decimal | None:
    """A ts or dur read from its JSON text as the strict decoder would; NaN where it is not a number."""
    if raw is None:
        return None
    try:
        return _decode_time(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return _NOT_A_NUMBER
