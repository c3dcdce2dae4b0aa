"""Reading a trace file: its decompressed bytes in blocks (`_chunks`), then the stream of them
(`_parse_stream`): the header up to the event list, the events chunk of whole events by chunk, and
at the end of the file the trailer, or the salvage of what came before a cut."""
from __future__ import annotations

import os
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import Iterator

import msgspec

from rankscope.ingest import reuse
from rankscope.ingest.discover import open_regular
from rankscope.ingest.errors import TraceError
from rankscope.ingest.kineto.boundaries import _NON_WS, _Gaps, _KeySearch, _last_boundary
from rankscope.ingest.kineto.columns import _Accumulator, _Tables
from rankscope.ingest.kineto.decode import _STRING_OR_CONSTANT, _JSONError
from rankscope.ingest.kineto.events import _decode_any, _decode_header
from rankscope.ingest.kineto.salvage import _decode_whole_events, _finish, _salvage

CHUNK_BYTES = 2 << 20          # decompressed bytes decoded at once (transient memory ~6x this)
HEADER_LIMIT = 64 << 20        # give up looking for "traceEvents" after this many bytes
#: The longest event read (its text, whitespace runs aside): no profiler writes one near it (the
#: corpus' longest string, a kernel name, has 5,160 characters); a longer one, e.g. a name of
#: 100 MB, cuts the file there.
MAX_EVENT_BYTES = 16 << 20
#: A gzip file stops being read once its text passes this many times its size (and 1 GiB): real
#: traces compress 10-30x (the corpus at most 30x), a gzip bomb up to ~1,000x.
MAX_GZIP_RATIO = 100
MIN_GZIP_LIMIT = 1 << 30


def _chunks(path: Path) -> Iterator[bytes | memoryview]:
    """Decompressed text of the file, in blocks (valid until the next one is asked for). A gzip
    stream that breaks (cut or corrupt) still yields everything decompressed before the break,
    then raises _ReadError."""
    try:
        with open_regular(path) as f:
            if f.read(2) != b"\x1f\x8b":
                f.seek(0)
                yield from _blocks(f)
                return
            f.seek(0)
            yield from _gunzip(f)
    except (OSError, EOFError) as exc:
        raise _ReadError(str(exc) or type(exc).__name__) from exc


def _blocks(f: BufferedReader) -> Iterator[memoryview]:
    """A plain file read into one buffer, over and over. (A new 2 MB `bytes` per read() was 4x
    slower: the C heap hands each one back to the OS and faults its pages in again.)"""
    block = bytearray(CHUNK_BYTES)
    with memoryview(block) as view:
        while n := f.readinto(block):
            yield view[:n]


def _gunzip(f: BufferedReader) -> Iterator[bytes]:
    """Inflate in small steps, so that a corrupt stream loses at most one step's output."""
    from isal import isal_zlib
    inflater = isal_zlib.decompressobj(wbits=31)
    limit = max(MIN_GZIP_LIMIT, MAX_GZIP_RATIO * os.fstat(f.fileno()).st_size)
    total = 0
    while True:
        if total > limit:
            raise _ReadError(f"decompressed past {limit:,} bytes, {MAX_GZIP_RATIO}x the file's size (real traces "
                             f"compress at most ~30x): read no further")
        data = f.read(_GZIP_STEP)
        if not data:
            if not inflater.eof:
                raise _ReadError("gzip stream is cut short (file truncated?)")
            return
        while data:
            try:
                out = inflater.decompress(data)
            except isal_zlib.error as exc:  # type: ignore[misc]  # isal's stub: an Exception, not the class
                raise _ReadError(f"corrupt gzip data ({exc})") from exc
            if out:
                total += len(out)
                yield out
            data = inflater.unused_data if inflater.eof else b""
            if inflater.eof and data.strip(b"\x00"):     # another gzip member follows
                inflater = isal_zlib.decompressobj(wbits=31)
            elif inflater.eof:
                data = b""


_GZIP_STEP = 8 << 10       # compressed bytes per inflate call: a corrupt stream loses at most ~100 KB


class _ReadError(Exception):
    """Decompression/IO failed partway; events read before it are kept."""


@dataclass
class _Parsed:
    header: dict
    trailer: dict
    acc: _Accumulator
    cut_at_byte: int | None = None
    cut_reason: str = ""
    fmt: str = "kineto"


def _parse_stream(path: Path, use_scanner: bool) -> _Parsed:
    acc = _Accumulator(_Tables(), use_scanner=use_scanner)
    chunks = _chunks(path)
    buf = bytearray()
    header_bytes = b""
    read_error = None
    fmt = "kineto"

    # 1. header: everything up to `"traceEvents": [` (or a bare top-level array); whitespace
    # before the document is dropped as it is read
    start = None          # position of the '[' that opens the event list
    skipped = 0           # bytes of leading whitespace dropped
    opened = False
    key = _KeySearch()
    try:
        for block in chunks:
            buf += block
            if not opened:
                first = _NON_WS.search(buf)
                lead = first.start() if first else len(buf)
                skipped += lead
                del buf[:lead]
                if not buf:
                    continue
                opened = True
                if buf[0] == 0x5B:
                    start = 0
                    fmt = "chrome-array"
                    break
                if buf[0] != 0x7B:
                    raise TraceError("not JSON (does not start with '{' or '[')")
            found = key.search(buf)
            if found:
                header_bytes = bytes(buf[:found[0]])
                start = found[1]
                break
            if len(buf) > HEADER_LIMIT:
                break
    except _ReadError as exc:
        read_error = exc
    if start is None:
        if read_error is not None:
            raise TraceError(f"cannot decompress: {read_error}")
        if not buf.strip():
            raise TraceError("empty file")
        try:
            _decode_any(bytes(buf))
        except msgspec.DecodeError:
            raise TraceError("file ends before its event list (truncated in the header?)") from None
        raise TraceError("JSON without a 'traceEvents' array: not a profiler trace")
    header = _parse_header(header_bytes)
    del buf[:start]
    consumed = skipped + start      # bytes of decompressed text before buf[0] (as in the file)
    searched = 0          # event boundaries whose '{' lies before this were looked for already
    gaps = _Gaps()        # long whitespace runs taken out of buf

    # 2. events, chunk by chunk; buf[0] is always the '[' or ',' before the next event
    eof = read_error is not None
    trailer: dict = {}
    cut_at = None
    cut_reason = ""
    while True:
        if not eof:
            try:
                buf += next(chunks)
                if len(buf) < CHUNK_BYTES:
                    continue
            except StopIteration:
                eof = True
            except _ReadError as exc:
                read_error, eof = exc, True
        if eof:
            done = _finish(buf, acc)
            if done is not None:
                trailer = done
                break
            kept = _salvage(buf, acc)
            cut_at = consumed + gaps.offset(kept)
            if read_error:
                cut_reason = str(read_error)
            elif _last_boundary(buf, len(buf)) > kept:     # whole events follow the break
                cut_reason = "invalid JSON inside the event list"
            else:
                cut_reason = "file ends mid-event (truncated)"
            break
        end = _decode_whole_events(buf, acc, searched)
        if end is None:
            gaps.collapse(buf)            # a run of whitespace at its end: kept as one space
            searched = len(buf)
            if len(buf) > MAX_EVENT_BYTES:        # one event that long: no profiler wrote it
                cut_at = consumed + gaps.offset(1)
                cut_reason = f"an event longer than {MAX_EVENT_BYTES >> 20} MiB (no profiler writes one)"
                break
            continue                      # no safe cut in what was read yet: read more
        if isinstance(end, _JSONError):
            cut_at = consumed + gaps.offset(_salvage(buf, acc, end.offset))
            cut_reason = "invalid JSON inside the event list"
            break
        comma = buf.index(b",", end)
        del buf[:comma]
        consumed += gaps.trimmed(comma)
        searched = len(buf)
    acc.scan_state = None             # the scanner's buffers and caches, before the frames are built
    del buf, chunks
    # the chunks' free heap, ~11 MB per 208 MB rank that glibc kept (its trim threshold rises with
    # the blocks freed), back to the OS before the frames are built: 0.6 ms
    reuse.trim_heap_unless_kept()
    return _Parsed(header, trailer, acc, cut_at, cut_reason, fmt)


def _parse_header(header_bytes: bytes) -> dict:
    text = header_bytes.rstrip().rstrip(b",").rstrip()
    if not text.strip():
        return {}
    text = text.decode("utf-8", "replace").encode("utf-8")
    try:
        try:
            h = _decode_header(text + b"}")
        except msgspec.DecodeError:       # NaN / Infinity (not JSON): read as the text "NaN", a wrong type
            h = _decode_header(_STRING_OR_CONSTANT.sub(lambda m: m[0] if m[1] is None else b'"%s"' % m[1], text)
                               + b"}")
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return {}   # an unreadable header (or one nested too deep) loses metadata, not events
    return {k: getattr(h, k) for k in h.__struct_fields__ if getattr(h, k) is not None}
