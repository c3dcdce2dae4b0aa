"""The restricted pickle reader (ingest/safe_pickle.py): the two ways past `find_class` that CPython's
C unpickler leaves open, each shown to be real on the unpickler alone and then refused by the
pre-scan before anything is unpickled, in C and in Python.

Expected behaviour comes from CPython's Modules/_pickle.c (`load_extension` returns an object from
`copyreg._extension_cache` without calling `find_class`; `_Unpickler_MemoPut` grows the memo array
to twice a PUT's index), observed here on the unpickler itself, not from rankscope's own output.
"""
from __future__ import annotations

import copyreg
import pickle
import struct
import subprocess
import sys

import pytest

from rankscope.ingest import TraceError
from rankscope.ingest import safe_pickle
from rankscope.ingest.safe_pickle import EXT_OPCODE, MEMO_INDEX, load_plain_pickle, read_plain_pickle

CALLS: list[str] = []
EXT_CODE = 0x7A31


def _record(what: str) -> str:
    CALLS.append(what)
    return what


def _ext_reduce(code: int) -> bytes:
    """PROTO 2, EXT2 code, BINUNICODE "pwn", TUPLE1, REDUCE, STOP: call the registered function."""
    return b"\x80\x02\x83" + struct.pack("<H", code) + b"X\x03\x00\x00\x00pwn\x85R."


def _scanners():
    yield "python", safe_pickle._hash_work
    if safe_pickle._picklescan is not None:
        yield "c", safe_pickle.hash_work


def test_ext_opcode_reaches_a_cached_function_past_find_class_and_is_refused():
    """With an extension registered and once unpickled (the cache filled, as any library using
    copyreg.add_extension would), the bare unpickler calls the function although find_class
    always raises; the reader refuses the stream first and nothing is called."""
    module = _record.__module__
    copyreg.add_extension(module, "_record", EXT_CODE)
    try:
        assert pickle.loads(b"\x80\x02\x83" + struct.pack("<H", EXT_CODE) + b".") is _record   # fills the cache
        CALLS.clear()
        assert load_plain_pickle(_ext_reduce(EXT_CODE)) == "pwn" and CALLS == ["pwn"]     # the hole, unguarded
        CALLS.clear()
        for name, scan in _scanners():
            assert scan(_ext_reduce(EXT_CODE), 1 << 40) == EXT_OPCODE, name
        with pytest.raises(TraceError, match="unsafe pickle, not loaded: it names an entry of the copyreg "
                                             "extension registry"):
            read_plain_pickle(_ext_reduce(EXT_CODE), "Flight Recorder dump")
        assert CALLS == []
    finally:
        copyreg.remove_extension(module, "_record", EXT_CODE)
        copyreg.clear_extension_cache()


_MEMO_BOMB = b"\x80\x02Nr\xff\xff\xff\x3f."       # PROTO 2, NONE, LONG_BINPUT 0x3fffffff, STOP: 9 bytes


def _capped(code: str) -> subprocess.CompletedProcess:
    """`code` in a Python whose address space is capped at 1 GB (so nothing here can take the
    machine's memory), after importing the reader."""
    prelude = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
               "from rankscope.ingest.safe_pickle import load_plain_pickle, read_plain_pickle; ")
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60)


def test_memo_index_bomb_allocates_on_the_bare_unpickler_and_is_refused():
    """9 bytes whose LONG_BINPUT index makes the bare unpickler ask for 16 GB (MemoryError under a
    1 GB cap, where a plain pickle of the same size loads); the reader refuses it, under the same cap,
    before unpickling."""
    bare = _capped(f"load_plain_pickle(b'\\x80\\x02N.'); load_plain_pickle({_MEMO_BOMB!r})")
    assert bare.returncode != 0 and bare.stderr.strip().splitlines()[-1] == "MemoryError", bare.stderr[-500:]
    guarded = _capped(f"""
try:
    read_plain_pickle({_MEMO_BOMB!r}, "Flight Recorder dump")
except Exception as exc:
    print(type(exc).__name__, exc)""")
    assert guarded.returncode == 0, guarded.stderr[-500:]
    assert guarded.stdout.startswith("TraceError unsafe pickle, not loaded: it stores an object at a memo index "
                                     "beyond the objects stored so far")
    for name, scan in _scanners():
        assert scan(_MEMO_BOMB, 1 << 40) == MEMO_INDEX, name


@pytest.mark.parametrize("stream, expected", [
    (b"\x80\x02N\x94Nq\x01.", 0),               # MEMOIZE (0) then BINPUT 1: in sequence
    (b"\x80\x02Nq\x00Nq\x00Nq\x01.", 0),        # BINPUT 0 twice, then 1
    (b"\x80\x02Nq\x02.", MEMO_INDEX),           # BINPUT 2 with nothing stored
    (b"\x80\x02Np1\n.", MEMO_INDEX),            # text PUT 1 with nothing stored
    (b"\x80\x02Np-1\n.", MEMO_INDEX),           # a negative index
    (b"\x80\x02Np0\nNp1\n.", 0),
    (b"\x80\x02q\x05.", 0),                     # BINPUT on an empty stack: the stream breaks first
    (b"\x80\x02\x82\x01.", EXT_OPCODE),
    (b"\x80\x02\x84\x01\x00\x00\x00.", EXT_OPCODE),
])
def test_prescan_refusals_by_hand(stream, expected):
    """Each stream's verdict by reading its opcodes (comments); C and Python agree."""
    for name, scan in _scanners():
        assert scan(stream, 1 << 40) == expected, name


def test_real_pickles_use_memo_indices_in_sequence():
    """What picklers write passes: Python's pickler at every protocol over shared and nested data,
    and the committed torch dumps (counted independently: every PUT index is at most the number of
    distinct indices stored before it, read with pickletools)."""
    import pickletools
    from pathlib import Path
    shared = ["x" * 3, ("a", 1)]
    data = [pickle.dumps({"k": shared, "l": [shared, {"m": shared}], "n": list(range(300))}, protocol=p)
            for p in range(6)]
    data += [p.read_bytes() for p in (Path(__file__).parent / "data" / "hangs").rglob("*")
             if p.is_file() and p.read_bytes()[:1] == b"\x80"]
    for d in data:
        stored: set[int] = set()
        for op, arg, _ in pickletools.genops(d):
            if op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                assert arg <= len(stored)
                stored.add(arg)
            elif op.name == "MEMOIZE":
                stored.add(len(stored))
        for name, scan in _scanners():
            assert scan(d, 1 << 40) >= 0, name


def _colliding_ints(n: int, key_op: bytes = b"\x8a\x10") -> bytes:
    """{"version": "2.10", "x": {k: 0 for k in keys}} by hand, keys i * (2**61 - 1) + 7 for i in
    1..n: ints of 62-66 bits (LONG1, 16 bytes each) whose hashes are all 7 (an int's hash is the int
    mod 2**61 - 1)."""
    keys = [i * ((1 << 61) - 1) + 7 for i in range(1, n + 1)]
    assert {hash(k) for k in keys} == {7}
    body = b"".join(key_op + k.to_bytes(16, "little", signed=True) + b"K\x00" for k in keys)
    return b"\x80\x02}(X\x07\x00\x00\x00versionX\x04\x00\x00\x002.10X\x01\x00\x00\x00x}(" + body + b"uu."


def test_colliding_int_keys_counted_and_refused():
    """n int keys with one hash: each insert compares with the keys before it. The count by hand:
    2 str keys at 1, n ints at 2 (1 + 62..66 bits // 60), and 0 + 1 + ... + (n - 1) for the
    collisions. 50,000 of them (1 MB) are refused, unpickled not; as many string keys read."""
    for n in (3, 2000):
        for name, scan in _scanners():
            assert scan(_colliding_ints(n), 1 << 62) == 2 + 2 * n + n * (n - 1) // 2, (name, n)
    with pytest.raises(TraceError, match=r"its dict keys or set members \(built from shared references, or not "
                                         r"strings, whose hashes can all be made equal\) would take over 64,0"):
        read_plain_pickle(_colliding_ints(50_000), "Flight Recorder dump")
    strings = pickle.dumps({"version": "2.10", "x": {f"k{i:014d}": 0 for i in range(50_000)}}, protocol=2)
    assert len(read_plain_pickle(strings, "Flight Recorder dump")["x"]) == 50_000
