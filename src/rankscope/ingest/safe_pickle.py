"""The one restricted pickle reader of the inputs that come as pickles (CUDA memory snapshots,
Flight Recorder dumps): it builds only plain data, and nothing in the file is ever imported or called.

A pickle can run any code it names, so the unpickler refuses every global (`find_class`) and every
persistent id. These files need none: they are dicts, lists, tuples, strings, numbers, booleans and
None (checked with `pickletools` on real files: no GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ or
NEWOBJ opcode). No torch is needed to read them.

Why nothing is ever called (CPython's C unpickler, Modules/_pickle.c, which `pickle.Unpickler` is):
an opcode calls something only when a callable is on its stack (REDUCE, NEWOBJ, NEWOBJ_EX, OBJ: the
callable popped; BUILD: the object's `__setstate__`) or when it resolves a name: GLOBAL,
STACK_GLOBAL and INST call `self.find_class`, PERSID / BINPERSID `self.persistent_load`, and the
EXT1 / EXT2 / EXT4 opcodes look the code up in `copyreg._extension_cache` FIRST and call
`find_class` only when it is not there: a process that ever unpickled that extension code (any
library registering one with `copyreg.add_extension`) would hand the cached class or function to
the stream without asking us. So `find_class` and `persistent_load` always raise, and the pre-scan
(below) refuses the EXT opcodes before anything is unpickled. Every other opcode pushes a str,
bytes, bytearray, int, float, bool, None, tuple, list, dict, set or frozenset, or links them
(APPEND(S) / SETITEM(S) / ADDITEMS on a list, dict or set: their own C methods, `list.extend`,
`set.add`); none of them is callable, and the `__setstate__` BUILD looks up does not exist on them
(BUILD then fails on the missing `__dict__`). So no callable ever reaches the stack.

Bounded: unpickling itself only links shared objects, except where it hashes: a dict key, a set or
frozenset member. Hashing a tuple hashes its items each time (not cached), so 60 tuples of two
references to the one before make a key of 2**60 items; and keys whose hashes are equal (an int's
hash is the int mod 2**61 - 1, so a file can choose them) make each insert compare with every key
before it: 50,000 such ints in a 1 MB file, 1.25e9 comparisons. Before anything is unpickled, the
opcode stream is read (`pickletools.genops`, nothing built) and the hashing it would do is counted,
each shared tuple at its full expanded size, the n-th key that is not a str (a str's hash is
keyed per process: it cannot be chosen) at n more: past `MAX_HASH_PER_BYTE` per byte of the file
(or `MAX_HASH_WORK` in all) the file is refused (`_hash_work`). The memo is an array indexed by the
PUT opcodes' numbers (`_Unpickler_MemoPut` grows it to twice the index and clears every new slot),
so a 10-byte pickle with LONG_BINPUT 0x40000000 makes it write 16 GB: the pre-scan refuses a memo
index beyond the number of objects memoized so far (picklers number them 0, 1, 2, ...). What the
readers then walk (a list shared by reference at many places) they bound themselves, per byte of
the file.
"""
from __future__ import annotations

import pickle
import pickletools

from rankscope.ingest.errors import TraceError

try:
    from rankscope.ingest import _picklescan
except ImportError:  # pragma: no cover  (no C compiler at install: the Python scan)
    _picklescan = None  # type: ignore[assignment]  # no C module: None (its stub types the built one)

#: Items hashed while unpickling (a tuple key: all the items it expands to, at each use), per byte
#: of the file, at most, and in all; real snapshots hash about one key per 10 bytes (the corpus: 0.03
#: per byte: string keys, whose hash is cached).
MAX_HASH_PER_BYTE = 64
MIN_HASH_LIMIT = 1 << 20
MAX_HASH_WORK = 1 << 31


class UnsafePickle(pickle.UnpicklingError):
    """The pickle names a global (a class or function to call): refused, nothing was run."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds only pickle's plain types; any global (class, function) is refused."""

    def __init__(self, file, what: str) -> None:
        super().__init__(file)
        self.what = what

    def find_class(self, module: str, name: str):
        raise UnsafePickle(f"it names the global {module}.{name}; a {self.what} holds only plain dicts, "
                           "lists, tuples, strings and numbers")

    def persistent_load(self, pid):
        raise UnsafePickle(f"it refers to an external object (persistent id); a {self.what} holds none")


class _Whole:
    """A file over bytes in memory whose `peek` gives all that is left: the C unpickler then reads
    the opcodes from the buffer itself (over io.BytesIO it calls `read` for each one: 2x slower)."""

    def __init__(self, data: bytes) -> None:
        self.view = memoryview(data)
        self.pos = 0

    def peek(self, n: int = 0) -> memoryview:
        return self.view[self.pos:]

    def read(self, n: int = -1) -> memoryview:
        start = self.pos
        self.pos = len(self.view) if n is None or n < 0 else min(len(self.view), start + n)
        return self.view[start:self.pos]

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    def readline(self) -> bytes:         # only where the rest holds no newline: a text opcode cut short
        rest = bytes(self.view[self.pos:])
        end = rest.find(b"\n")
        return bytes(self.read(len(rest) if end < 0 else end + 1))


def load_plain_pickle(data: bytes, what: str = "plain-data pickle"):
    """Unpickle bytes with no global allowed (UnsafePickle on any); `what` names the file's kind in
    the message. Unsafe alone: call it after `hash_work` (`read_plain_pickle` does)."""
    return _PlainUnpickler(_Whole(data), what).load()


def read_plain_pickle(data: bytes, what: str):
    """The plain data of a pickle (`what`: the kind of file, for the messages), read safely: the
    hashing its opcodes would do is counted first (`_hash_work`, nothing built) and past the limit
    it is refused; then it is unpickled with no global allowed. Raises TraceError (one line)."""
    limit = min(MAX_HASH_WORK, max(MIN_HASH_LIMIT, MAX_HASH_PER_BYTE * len(data)))
    work = hash_work(data, limit)
    if work in REFUSED:
        raise TraceError(f"unsafe pickle, not loaded: {REFUSED[work]}")
    if work > limit:
        raise TraceError(f"{what}: its dict keys or set members (built from shared references, or not "
                         f"strings, whose hashes can all be made equal) would take over {limit:,} hashing steps "
                         f"to unpickle ({MAX_HASH_PER_BYTE} per byte of the file at most): refused, not unpickled")
    try:
        return load_plain_pickle(data, what)
    except UnsafePickle as exc:
        raise TraceError(f"unsafe pickle, not loaded: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError, TypeError, AttributeError,
            MemoryError, OverflowError, RecursionError) as exc:      # AttributeError: APPEND on a dict
        raise TraceError(f"truncated or damaged pickle ({type(exc).__name__}: {exc or 'ran out of input'})") from None


#: What the pre-scan returns instead of a count for a stream it refuses outright, and why.
EXT_OPCODE, MEMO_INDEX = -1, -2
REFUSED = {EXT_OPCODE: "it names an entry of the copyreg extension registry (EXT opcode), which can be a class "
                       "or function",
           MEMO_INDEX: "it stores an object at a memo index beyond the objects stored so far (the unpickler "
                       "would allocate memory for every index below it)"}
_EXTS = {"EXT1", "EXT2", "EXT4"}

#: Opcode name -> (items popped below a mark, pops to a mark, items pushed), from pickletools.
_STACK_EFFECT = {op.name: (op.stack_before.index(pickletools.markobject)
                           if pickletools.markobject in op.stack_before else len(op.stack_before),
                           pickletools.markobject in op.stack_before, len(op.stack_after))
                 for op in pickletools.opcodes}
_GETS = {"BINGET", "LONG_BINGET", "GET"}
_PUTS = {"BINPUT", "LONG_BINPUT", "PUT"}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_INTS = {"LONG", "LONG1", "LONG4", "INT"}
#: Opcodes that push a str: on the simulated stack its cost is 1.0 (a float marks a str).
_STRS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING", "SHORT_BINSTRING"}


#: The C scanner's opcode table: per opcode byte (arg, special, below, to_mark, pushed); _picklescan.c.
_ARG_TWO_LINES = -6
_SPECIALS = {"GET": 1, "BINGET": 2, "LONG_BINGET": 3, "PUT": 4, "BINPUT": 5, "LONG_BINPUT": 6, "MEMOIZE": 7,
             "MARK": 8, "TUPLE1": 9, "TUPLE2": 9, "TUPLE3": 9, "SETITEM": 10, "DUP": 11, "POP": 12, "SETITEMS": 13,
             "DICT": 13, "ADDITEMS": 14, "FROZENSET": 14, "TUPLE": 15, "INT": 16, "LONG": 17, "LONG1": 18,
             "LONG4": 18, "STOP": 19, "EXT1": 20, "EXT2": 20, "EXT4": 20, "SHORT_BINUNICODE": 21, "BINUNICODE": 21,
             "BINUNICODE8": 21, "UNICODE": 21, "STRING": 21, "BINSTRING": 21, "SHORT_BINSTRING": 21}


def _scan_table() -> list:
    table: list = [None] * 256
    for op in pickletools.opcodes:
        arg = op.arg
        n = 0 if arg is None else _ARG_TWO_LINES if arg.name == "stringnl_noescape_pair" else arg.n
        below, to_mark, pushed = _STACK_EFFECT[op.name]
        table[ord(op.code)] = (n, _SPECIALS.get(op.name, 0), below, int(to_mark), pushed)
    return table


def hash_work(data: bytes, limit: int) -> int:
    """`_hash_work` (a count, or a key of REFUSED), by the C scanner where it is built (the same
    count, ~100x faster)."""
    if _picklescan is None:
        return _hash_work(data, limit)
    global _TABLE
    if _TABLE is None:
        _TABLE = _scan_table()
    return _picklescan.hash_work(data, limit, _TABLE)


_TABLE: list | None = None


def _hash_work(data: bytes, limit: int) -> int:
    """How many items unpickling `data` would hash (dict keys, set and frozenset members), counted
    from the opcode stream without building anything; stops once past `limit`. A stream that
    unpickling cannot be trusted with returns a key of REFUSED instead: an EXT opcode, or a memo
    index (PUT, BINPUT, LONG_BINPUT) above the number of objects memoized so far. Each object on the
    simulated stack is its hashing cost: a tuple 1 + its items' costs (shared ones at every use),
    an int 1 + its size in 60-bit digits (an int's hash is not cached), anything else 1 (a str's
    hash is cached; a list or dict is not hashable: hashing it fails at once). A str's cost is the
    float 1.0, which marks it: a key or member that is not a str may collide with every one before
    it (an int's hash is the int mod 2**61 - 1: a file can choose them equal, and each insert then
    compares with all the others), so the n-th such one in the file also counts n - 1. A stream
    that breaks (bad opcode, cut, stack underflow) ends the count there: unpickling fails at the
    same opcode."""
    stack: list[float] = []       # each object's hashing cost (a float: a str)
    marks: list[int] = []        # stack lengths at each MARK, as the unpickler keeps them
    memo: dict = {}
    work = others = 0              # others: keys and members so far that are not a str
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in _GETS:
                stack.append(memo.get(arg, 1))
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in _PUTS:
                top = stack[-1]
                if arg is None or not 0 <= arg <= len(memo):
                    return MEMO_INDEX
                memo[arg] = top
            elif name in _EXTS:
                return EXT_OPCODE
            elif name == "MARK":
                marks.append(len(stack))
            elif name in _TUPLES:
                n = _TUPLES[name]
                if len(stack) - (marks[-1] if marks else 0) < n:
                    break
                cost: float = 1 + sum(map(int, stack[-n:]))
                del stack[-n:]
                stack.append(cost)
            elif name == "SETITEM":
                if len(stack) - (marks[-1] if marks else 0) < 3:
                    break
                key = stack[-2]
                work += int(key)
                if type(key) is not float:
                    work += others
                    others += 1
                del stack[-2:]
            elif name == "DUP":
                stack.append(stack[-1])
            elif name == "POP" and marks and marks[-1] == len(stack):
                marks.pop()                      # POP of a mark drops the mark
            else:
                below, to_mark, pushed = _STACK_EFFECT[name]
                items: list[float] = []
                if to_mark:
                    at = marks.pop()
                    items = stack[at:]
                    del stack[at:]
                if below:
                    if len(stack) - (marks[-1] if marks else 0) < below:
                        break
                    del stack[-below:]
                hashed = items[0::2] if name in ("SETITEMS", "DICT") else items if name in (
                    "ADDITEMS", "FROZENSET") else []
                work += sum(map(int, hashed))
                for x in hashed:
                    if work > limit:
                        break
                    if type(x) is not float:
                        work += others
                        others += 1
                cost = 1.0 if name in _STRS else 1
                if name == "TUPLE":
                    cost += sum(map(int, items))
                elif name in _INTS and isinstance(arg, int):
                    cost += arg.bit_length() // 60
                stack.extend([cost] * pushed)
            if work > limit:
                break
    except (ValueError, IndexError):      # a broken stream: unpickling fails there too
        pass
    return work
