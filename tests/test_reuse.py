"""Memory kept from one rank for the next (`rankscope.ingest.reuse`): a rank read inside
`between_ranks()`, in memory an earlier rank used, has exactly the frames it has when read alone,
and a rank still held is never overwritten. Expected values: the same files read outside
`between_ranks()`, where nothing is reused."""
from __future__ import annotations

import contextlib
import ctypes
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import DLRM, corpus_files
from rankscope.ingest import read_trace, reuse

RESNET = "kineto-resnet50-workers0"


def _frames(path: Path) -> dict:
    return read_trace(path)[0].frames()


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].equals(b[name]), name


@pytest.fixture
def counted_reuse(monkeypatch) -> list:
    """Every map `spare_map` hands back (so that a test can tell that memory was reused)."""
    handed: list = []
    spare_map = reuse.spare_map

    def counting(key, nbytes):
        m = spare_map(key, nbytes)
        if m is not None:
            handed.append(key)
        return m
    monkeypatch.setattr(reuse, "spare_map", counting)
    return handed


def test_a_rank_read_in_an_earlier_ranks_memory_has_its_own_frames(corpus: Path, counted_reuse: list):
    big, small = corpus_files(corpus, RESNET)[0], corpus_files(corpus, DLRM)[0]
    alone = {p: _frames(p) for p in (big, small)}
    assert not counted_reuse                    # outside between_ranks nothing is kept
    with reuse.between_ranks():
        for path in (big, small, big, small):   # larger, then smaller, then larger again
            _same(_frames(path), alone[path])
    assert len(counted_reuse) > 10              # the columns' maps were reused
    assert not reuse._spare                     # and let go on leaving


def test_a_parse_hands_its_free_heap_back_only_where_it_is_not_kept(corpus: Path, monkeypatch):
    """The chunks' free heap goes back to the OS once a file is parsed (validate, load), but not
    between ranks (analyze keeps it for the next rank). Expected: one trim per file read outside
    `between_ranks()`, none inside, counted on `reuse.trim_heap`."""
    trims: list = []
    monkeypatch.setattr(reuse, "trim_heap", lambda: trims.append(1))
    small = corpus_files(corpus, DLRM)[0]
    read_trace(small)
    read_trace(small)
    assert len(trims) == 2
    with reuse.between_ranks():
        read_trace(small)
    assert len(trims) == 2


def test_a_rank_still_held_is_not_overwritten(corpus: Path, counted_reuse: list):
    first, second = corpus_files(corpus, DLRM)[:2]
    alone = {p: _frames(p) for p in (first, second)}
    with reuse.between_ranks():
        held = _frames(first)
        again = _frames(second)                 # read while `held` views its maps
        _same(held, alone[first])
        _same(again, alone[second])
        del again
        _same(_frames(first), alone[first])     # in the maps the second read let go
        _same(held, alone[first])
        assert counted_reuse


def test_ranks_read_by_threads_at_once(corpus: Path, counted_reuse: list):
    files = corpus_files(corpus, DLRM)
    alone = {p: _frames(p) for p in files}
    failures: list = []

    def read(paths: list[Path]) -> None:
        try:
            for p in paths * 2:
                _same(_frames(p), alone[p])
        except BaseException as exc:
            failures.append(exc)

    with reuse.between_ranks():
        threads = [threading.Thread(target=read, args=(files[k::2],)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not failures, failures
    assert counted_reuse


def test_between_ranks_nests(corpus: Path, counted_reuse: list):
    path = corpus_files(corpus, DLRM)[0]
    with reuse.between_ranks():
        with reuse.between_ranks():
            _frames(path)
        assert reuse._spare                     # the outer one still keeps them
        _frames(path)
    assert not reuse._spare
    assert counted_reuse


@pytest.mark.parametrize("engine", ["inprocess", "local"])
def test_a_job_analysed_with_memory_kept_between_ranks(corpus: Path, counted_reuse: list, monkeypatch, engine: str):
    """The whole analysis (every rank's summary, the cross-rank results, the findings) of an
    8-rank job is the one made with nothing kept between ranks."""
    from rankscope.pipelines import job
    from rankscope.results import to_plain
    folder = corpus / "cpu-gloo-3d-pp2dp2tp2"
    monkeypatch.setattr(reuse, "_heap_is_ours", True)     # the heap kept too, as in the command line

    with_reuse = to_plain(job.analyze(folder, use_cache=False, engine=engine, workers=2))
    assert counted_reuse                        # memory was reused
    monkeypatch.setattr(reuse, "between_ranks", contextlib.nullcontext)
    counted_reuse.clear()
    without = to_plain(job.analyze(folder, use_cache=False, engine=engine, workers=2))
    assert not counted_reuse
    assert with_reuse == without


HEAP = '''
import ctypes, json, sys
from rankscope.ingest import reuse

libc = ctypes.CDLL(None)

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def mapped(nbytes):
    """Whether malloc gives a block of `nbytes` a memory map of its own (mallinfo2's count of those)."""
    before = libc.mallinfo2().hblks
    block = libc.malloc(nbytes)
    own_map = libc.mallinfo2().hblks > before
    libc.free(block)
    return own_map

if sys.argv[1] == "own":
    reuse.own_process()
libc.free(libc.malloc(8 << 20))       # a mapped 8 MB block freed: glibc's mmap threshold rises to 8 MB
seen = {"before": mapped(4 << 20)}
with reuse.between_ranks():
    seen["inside"] = mapped(16 << 20)
reuse.trim_heap()                     # as analyze does after its map: the heap's free top handed back
seen["after"] = mapped(4 << 20)
print(json.dumps(seen))
'''


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc's malloc (2.33 or later)")
@pytest.mark.parametrize("process, expected", [
    # a user's process: glibc's own rules throughout (its threshold follows the largest mapped block freed)
    ("user", {"before": False, "inside": True, "after": False}),
    # rankscope's own: blocks up to 32 MB from the heap inside; after it, glibc's fixed 128 KB threshold
    ("own", {"before": False, "inside": False, "after": True}),
])
def test_the_heap_is_set_only_in_rankscopes_own_processes(tmp_path: Path, process: str, expected: dict):
    """Once a program sets glibc's mmap threshold, glibc never adapts it again: a user's process
    that analyses a job keeps glibc's behaviour. Expected values: glibc's rules (mallopt(3),
    "M_MMAP_THRESHOLD": the dynamic threshold, and its end once a threshold is set)."""
    script = tmp_path / "heap.py"
    script.write_text(HEAP)
    proc = subprocess.run([sys.executable, script, process], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == expected
