"""Where things are in the raw text, without decoding it: the boundaries between events (`}, {`),
the event list's key in the header (`_KeySearch`), runs of whitespace (`_Gaps` keeps long ones out
of memory)."""
from __future__ import annotations

import re

_JSON_WS = b" \t\n\r"
_NON_WS = re.compile(rb"[^ \t\n\r]")
_BOUNDARY = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")
_EVENTS_KEY = b'"traceEvents"'


def _last_boundary(buf: bytes | bytearray, before: int, lo: int = 0) -> int:
    """Position just after the '}' of the last `}, {` event boundary whose '{' lies in
    buf[lo:before]; -1 if none. Reads buf[lo:before] in windows from its end (each 4x the last:
    about once in all), and the whitespace before `lo` only when a boundary may straddle it."""
    window = 1 << 12
    while True:
        start = max(lo, before - window)
        last = -1
        for m in _BOUNDARY.finditer(buf, start, before):
            last = m.start() + 1
        if last >= 0:
            return last
        if start == lo:
            return _boundary_at(buf, lo, before) if lo else -1
        window *= 4


def _boundary_at(buf: bytes | bytearray, lo: int, before: int) -> int:
    """The boundary whose '}' lies before `lo` and whose '{' is the first '{' in buf[lo:before]
    (only whitespace and the ',' between them); -1 if none."""
    brace = _first_non_ws(buf, lo, before)
    if brace < 0:
        return -1
    comma_seen = buf[brace] == 0x2C
    if comma_seen:
        brace = _first_non_ws(buf, brace + 1, before)
        if brace < 0:
            return -1
    if buf[brace] != 0x7B:
        return -1
    end = _ws_start(buf, lo)
    if not comma_seen:
        if end == 0 or buf[end - 1] != 0x2C:
            return -1
        end = _ws_start(buf, end - 1)
    return end if end > 0 and buf[end - 1] == 0x7D else -1


def _ws_start(buf: bytes | bytearray, end: int) -> int:
    """Where the run of JSON whitespace that ends at `end` starts."""
    step = 64
    while end > 0:
        lo = max(0, end - step)
        piece = buf[lo:end]
        if not _all_ws(piece):
            return lo + len(piece.rstrip(_JSON_WS))
        end, step = lo, min(step * 4, 1 << 20)
    return 0


def _first_non_ws(buf: bytes | bytearray, lo: int, before: int) -> int:
    """Position of the first byte in buf[lo:before] that is not JSON whitespace; -1 if none."""
    step = 64
    while lo < before:
        hi = min(before, lo + step)
        piece = buf[lo:hi]
        if not _all_ws(piece):
            m = _NON_WS.search(buf, lo, hi)
            assert m is not None              # the piece holds a byte that is not JSON whitespace
            return m.start()
        lo, step = hi, min(step * 4, 1 << 20)
    return -1


def _all_ws(piece: bytes | bytearray) -> bool:
    """All of `piece` (not empty) is JSON whitespace (isspace() also takes \\v and \\f: ruled out);
    several times faster than a regex or rstrip over long runs."""
    return piece.isspace() and b"\x0b" not in piece and b"\x0c" not in piece


#: The rest of a JSON string from inside it: up to its closing quote, or to a backslash whose
#: escaped byte is not read yet, or to the end of what was read.
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
#: Whitespace runs longer than this, at the end of the buffer and outside strings, are cut.
GAP_BYTES = 64 << 10


class _Gaps:
    """Keeps a run of whitespace between tokens (e.g. 512 MB of spaces between two events) out of
    the buffer: while no event ends in what was read, the buffer's end is followed in and out of
    strings (each byte read once: linear), and whitespace that ends it outside a string is cut to
    one space. Memory is then the events plus one chunk, whatever the gaps. Whitespace inside a
    string is its content and stays. `offset` gives a buffer position as a position in the file."""

    def __init__(self) -> None:
        self.pos = 1                 # buf[:pos] was followed; buf[0] (the '[' or ',') is outside strings
        self.in_string = False
        self.cuts: list[tuple[int, int]] = []    # (position in buf, bytes cut there)

    def collapse(self, buf: bytearray) -> None:
        pos, n = self.pos, len(buf)
        while pos < n:
            if not self.in_string:
                quote = buf.find(b'"', pos)
                if quote < 0:
                    pos = n
                    break
                pos, self.in_string = quote + 1, True
            else:
                rest = _STRING_REST.match(buf, pos)
                assert rest is not None       # the pattern matches the empty string too
                end = rest.end()
                if end >= n or buf[end] != 0x22:        # the string goes on past what was read
                    pos = end
                    break
                pos, self.in_string = end + 1, False
        self.pos = pos
        if self.in_string:
            return
        ws = _ws_start(buf, n)
        if n - ws > GAP_BYTES:
            self.cuts.append((ws + 1, n - ws - 1))
            del buf[ws + 1:]
            self.pos = len(buf)

    def offset(self, pos: int) -> int:
        """Bytes of the file's text before buf[pos]."""
        return pos + sum(cut for at, cut in self.cuts if at <= pos)

    def trimmed(self, n: int) -> int:
        """buf lost its first n bytes (buf[0] is again a ',' between events): how many bytes of the
        file's text they stood for."""
        done = self.offset(n)
        self.cuts = [(at - n, cut) for at, cut in self.cuts if at > n]
        self.pos, self.in_string = 1, False
        return done


class _KeySearch:
    """Finds `"traceEvents": [` in a buffer that grows between calls. Each call goes on where the
    last one stopped, also inside the whitespace after a key, so each byte is read about twice."""

    def __init__(self) -> None:
        self.pos = 0                    # where to look for the next key
        self.key: int | None = None     # a key whose ': [' is not all read yet
        self.after = 0                  # what follows that key was read up to here
        self.colon = False

    def search(self, buf: bytearray) -> tuple[int, int] | None:
        """(position of the key, position of its '['); None: not in `buf` yet."""
        while True:
            if self.key is None:
                k = buf.find(_EVENTS_KEY, self.pos)
                if k < 0:
                    self.pos = max(self.pos, len(buf) - len(_EVENTS_KEY) + 1)
                    return None
                self.key, self.after, self.colon = k, k + len(_EVENTS_KEY), False
            m = _NON_WS.search(buf, self.after)
            if m is None:
                self.after = len(buf)
                return None
            if buf[m.start()] == 0x3A and not self.colon:
                self.after, self.colon = m.start() + 1, True
            elif buf[m.start()] == 0x5B and self.colon:
                return self.key, m.start()
            else:
                self.pos, self.key = self.key + 1, None
