"""The one restricted pickle reader of the inputs that come as pickles (CUDA memory snapshots,
Flight Recorder dumps): it builds only plain data, and nothing in the file is ever imported or called.

A pickle can run any code it names, so the unpickler refuses every global (`find_class`) and every
persistent id. These files need none: they are dicts, lists, tuples, strings, numbers, booleans and
None (checked with `pickletools` on real files: no GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ or
NEWOBJ opcode). Objects cannot be built without a global, so nothing in the file is ever called;
no torch is needed to read them.

Bounded: unpickling itself only links shared objects, except where it hashes: a dict key, a set or
frozenset member. Hashing a tuple hashes its items each time (not cached), so 60 tuples of two
references to the one before make a key of 2**60 items. Before anything is unpickled, the opcode
stream is read (`pickletools.genops`, nothing built) and the hashing it would do is counted, each
shared tuple at its full expanded size: past `MAX_HASH_PER_BYTE` per byte of the file (or
`MAX_HASH_WORK` in all) the file is refused (`_hash_work`). What the readers then walk (a list
shared by reference at many places) they bound themselves, per byte of the file.
"""
from __future__ import annotations

import io
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


def load_plain_pickle(data: bytes, what: str = "plain-data pickle"):
    """Unpickle bytes with no global allowed (UnsafePickle on any); `what` names the file's kind in
    the message."""
    return _PlainUnpickler(io.BytesIO(data), what).load()


def read_plain_pickle(data: bytes, what: str):
    """The plain data of a pickle (`what`: the kind of file, for the messages), read safely: the
    hashing its opcodes would do is counted first (`_hash_work`, nothing built) and past the limit
    it is refused; then it is unpickled with no global allowed. Raises TraceError (one line)."""
    limit = min(MAX_HASH_WORK, max(MIN_HASH_LIMIT, MAX_HASH_PER_BYTE * len(data)))
    work = hash_work(data, limit)
    if work > limit:
        raise TraceError(f"{what}: its dict keys or set members, built from shared references, would "
                         f"take over {limit:,} hashing steps to unpickle ({MAX_HASH_PER_BYTE} per byte of the "
                         f"file at most): refused, not unpickled")
    try:
        return load_plain_pickle(data, what)
    except UnsafePickle as exc:
        raise TraceError(f"unsafe pickle, not loaded: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError, TypeError, MemoryError,
            OverflowError, RecursionError) as exc:
        raise TraceError(f"truncated or damaged pickle ({type(exc).__name__}: {exc or 'ran out of input'})") from None


#: Opcode name -> (items popped below a mark, pops to a mark, items pushed), from pickletools.
_STACK_EFFECT = {op.name: (op.stack_before.index(pickletools.markobject)
                           if pickletools.markobject in op.stack_before else len(op.stack_before),
                           pickletools.markobject in op.stack_before, len(op.stack_after))
                 for op in pickletools.opcodes}
_GETS = {"BINGET", "LONG_BINGET", "GET"}
_PUTS = {"BINPUT", "LONG_BINPUT", "PUT"}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_INTS = {"LONG", "LONG1", "LONG4", "INT"}


#: The C scanner's opcode table: per opcode byte (arg, special, below, to_mark, pushed); _picklescan.c.
_ARG_TWO_LINES = -6
_SPECIALS = {"GET": 1, "BINGET": 2, "LONG_BINGET": 3, "PUT": 4, "BINPUT": 5, "LONG_BINPUT": 6, "MEMOIZE": 7,
             "MARK": 8, "TUPLE1": 9, "TUPLE2": 9, "TUPLE3": 9, "SETITEM": 10, "DUP": 11, "POP": 12, "SETITEMS": 13,
             "DICT": 13, "ADDITEMS": 14, "FROZENSET": 14, "TUPLE": 15, "INT": 16, "LONG": 17, "LONG1": 18,
             "LONG4": 18, "STOP": 19}


def _scan_table() -> list:
    table: list = [None] * 256
    for op in pickletools.opcodes:
        arg = op.arg
        n = 0 if arg is None else _ARG_TWO_LINES if arg.name == "stringnl_noescape_pair" else arg.n
        below, to_mark, pushed = _STACK_EFFECT[op.name]
        table[ord(op.code)] = (n, _SPECIALS.get(op.name, 0), below, int(to_mark), pushed)
    return table


def hash_work(data: bytes, limit: int) -> int:
    """`_hash_work`, by the C scanner where it is built (the same count, ~100x faster)."""
    if _picklescan is None:
        return _hash_work(data, limit)
    global _TABLE
    if _TABLE is None:
        _TABLE = _scan_table()
    return _picklescan.hash_work(data, limit, _TABLE)


_TABLE: list | None = None


def _hash_work(data: bytes, limit: int) -> int:
    """How many items unpickling `data` would hash (dict keys, set and frozenset members), counted
    from the opcode stream without building anything; stops once past `limit`. Each object on the
    simulated stack is its hashing cost: a tuple 1 + its items' costs (shared ones at every use),
    an int 1 + its size in 60-bit digits (an int's hash is not cached), anything else 1 (a str's
    hash is cached; a list or dict is not hashable: hashing it fails at once). A stream that breaks
    (bad opcode, cut, stack underflow) ends the count there: unpickling fails at the same opcode."""
    stack: list[int] = []
    marks: list[int] = []        # stack lengths at each MARK, as the unpickler keeps them
    memo: dict = {}
    work = 0
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in _GETS:
                stack.append(memo.get(arg, 1))
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in _PUTS:
                memo[arg] = stack[-1]
            elif name == "MARK":
                marks.append(len(stack))
            elif name in _TUPLES:
                n = _TUPLES[name]
                if len(stack) - (marks[-1] if marks else 0) < n:
                    break
                cost = 1 + sum(stack[-n:])
                del stack[-n:]
                stack.append(cost)
            elif name == "SETITEM":
                if len(stack) - (marks[-1] if marks else 0) < 3:
                    break
                work += stack[-2]
                del stack[-2:]
            elif name == "DUP":
                stack.append(stack[-1])
            elif name == "POP" and marks and marks[-1] == len(stack):
                marks.pop()                      # POP of a mark drops the mark
            else:
                below, to_mark, pushed = _STACK_EFFECT[name]
                items: list[int] = []
                if to_mark:
                    at = marks.pop()
                    items = stack[at:]
                    del stack[at:]
                if below:
                    if len(stack) - (marks[-1] if marks else 0) < below:
                        break
                    del stack[-below:]
                if name in ("SETITEMS", "DICT"):
                    work += sum(items[0::2])
                elif name in ("ADDITEMS", "FROZENSET"):
                    work += sum(items)
                cost = 1
                if name == "TUPLE":
                    cost += sum(items)
                elif name in _INTS and isinstance(arg, int):
                    cost += arg.bit_length() // 60
                stack.extend([cost] * pushed)
            if work > limit:
                break
    except (ValueError, IndexError):      # a broken stream: unpickling fails there too
        pass
    return work
