"""A second worker process for the local engine, forked the moment the command line starts.

Two ranks analysed in two threads of one process contend for its interpreter lock: the analyses
hand it back and forth hundreds of times per rank (every polars and large numpy call releases it),
and on 8 x 200 MB ranks the two threads of the local engine lose ~20% to each other. A worker
process has its own lock. It must be forked before numpy and polars are imported, while this
process has a single thread (polars starts threads at import, and a fork then can deadlock); so
the command line forks it first thing (`start`), on Linux, for the commands that analyse ranks,
and it imports what the per-rank work needs while this process imports the commands.

The local engine then hands ranks to it from one of its worker threads (`WorkerProcess.run`) and the
other threads analyse the rest here. Nothing depends on it: a map that starts before it is ready
does not wait for it, a map of fewer than two ranks or another engine leaves it unused, and if it
dies its rank is analysed here and the map goes on without it. It ignores Ctrl-C (the terminal
sends it to both processes; this one decides) and dies with this process (Linux's parent-death
signal), so it never outlives the command.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import threading
from typing import Any, Callable

#: The commands whose per-rank work (parse and analyses) the worker process shares.
COMMANDS = ("analyze", "diff", "mfu")
#: What the per-rank work imports: done by the worker before it says it is ready.
_WORK_MODULES = ("rankscope.pipelines.job", "rankscope.analyses.rank.summary")
_PR_SET_PDEATHSIG = 1
_READY = "ready"

_worker: WorkerProcess | None = None


class WorkerLost(Exception):
    """The worker process died, or its pipe broke: what it was given is to be run here."""


class WorkerProcess:
    """The driver's end of the worker process: one task at a time (the local engine gives it one
    worker thread)."""

    def __init__(self, pid: int, tasks: int, results: int):
        self.pid = pid
        self._tasks = os.fdopen(tasks, "wb")
        self._results = os.fdopen(results, "rb")
        self._lock = threading.Lock()
        self.ready = False
        self.lost = False

    def wait_ready(self, give_up: Callable[[], bool], poll_s: float = 0.02) -> bool:
        """Wait until the worker has imported the per-rank work; False (at once) when it is lost,
        or as soon as `give_up()` is true (the map no longer needs it)."""
        with self._lock:
            while not self.ready and not self.lost:
                if give_up():
                    return False
                if select.select([self._results], [], [], poll_s)[0]:
                    try:
                        self._receive()      # its first message says it is ready
                    except WorkerLost:
                        return False
        return self.ready and not self.lost

    def run(self, fn: Callable[[Any], Any], item: Any) -> Any:
        """fn(item) in the worker process. Raises what fn raised there, or WorkerLost."""
        with self._lock:
            if self.lost:
                raise WorkerLost
            try:
                pickle.dump((fn, item), self._tasks, protocol=pickle.HIGHEST_PROTOCOL)
                self._tasks.flush()
            except (OSError, pickle.PicklingError, TypeError, AttributeError) as exc:
                self.stop()
                raise WorkerLost from exc
            ok, value = self._receive()
        if not ok:
            raise value
        return value

    def _receive(self) -> tuple[bool, Any]:
        try:
            message = pickle.load(self._results)
        except Exception as exc:         # EOF (it died), a broken pipe, a message cut short
            self.stop()
            raise WorkerLost from exc
        if message == _READY:
            self.ready = True
        return message

    def stop(self) -> None:
        """End the worker (its task, if any, is dropped) and reap it."""
        self.lost = True
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (OSError, ChildProcessError):
            pass


def worker() -> WorkerProcess | None:
    """The worker process of this command line, while it is usable."""
    return _worker if _worker is not None and not _worker.lost else None


def wanted(argv: list[str]) -> bool:
    """Whether the command line `argv` (without the program) is worth a worker process: a command
    that analyses ranks, on Linux (fork), with two usable CPUs, more than one trace file named or a
    folder, and no option that rules it out (an engine other than the local one, one worker, help,
    the demo). A hint read from the words alone: the engine decides later, with the files in hand,
    whether to use it."""
    if not sys.platform.startswith("linux") or not argv or argv[0] not in COMMANDS:
        return False
    if len(os.sched_getaffinity(0)) < 2 or os.environ.get("RANKSCOPE_NO_WORKER_PROCESS"):
        return False
    paths, words = [], iter(argv[1:])
    for word in words:
        name, eq, value = word.partition("=")
        if word in ("-h", "--help", "--demo") or name == "--address":
            return False
        if name in _VALUE_OPTIONS:
            value = value if eq else next(words, "")
            if (name == "--engine" and value not in ("auto", "local")) or (name == "--workers" and value == "1"):
                return False
        elif not word.startswith("-"):
            paths.append(word)
    return len(paths) > 1 or any(not os.path.isfile(p) for p in paths)


#: The options of those commands that take a value (the word after them is no input path).
_VALUE_OPTIONS = {"--engine", "--workers", "--address", "--cache-dir", "--threshold", "--html", "--nccl-log", "--job",
                  "--model-flops-per-step", "--layers", "--hidden", "--heads", "--vocab", "--seq", "--batch",
                  "--recompute", "--dtype"}


def start(argv: list[str]) -> None:
    """Fork the worker process when `wanted(argv)`. Call before numpy or polars is imported."""
    global _worker
    if _worker is not None or not wanted(argv):
        return
    tasks_r, tasks_w = os.pipe()
    results_r, results_w = os.pipe()
    parent = os.getpid()
    # SIGINT blocked across the fork: the worker ignores it before any Ctrl-C can reach it
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    if pid == 0:
        try:
            os.close(tasks_w)
            os.close(results_r)
            _serve(tasks_r, results_w, parent)
        finally:
            os._exit(0)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    os.close(tasks_r)
    os.close(results_w)
    if pid < 0:
        os.close(tasks_w)
        os.close(results_r)
        return
    _worker = WorkerProcess(pid, tasks_w, results_r)


def _serve(tasks: int, results: int, parent: int) -> None:
    """The worker process: import the per-rank work, say so, then run what arrives until the
    driver closes its end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        import ctypes
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:        # the driver ended before the signal was set
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    import gc
    import importlib
    for module in _WORK_MODULES:
        importlib.import_module(module)
    gc.freeze()                       # as the command line does: the imports' objects out of the collector's walks
    out = os.fdopen(results, "wb")
    pickle.dump(_READY, out)
    out.flush()
    from rankscope.ingest import reuse
    reuse.own_process()
    with os.fdopen(tasks, "rb") as inbox, reuse.between_ranks():    # it serves one analysis's ranks
        while True:
            try:
                fn, item = pickle.load(inbox)
            except EOFError:
                return
            try:
                reply = (True, fn(item))
            except Exception as exc:
                reply = (False, exc)
            try:
                data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                data = pickle.dumps((False, RuntimeError(f"result could not be sent back: {exc}")))
            out.write(data)
            out.flush()
