"""How per-rank work is mapped. Same function everywhere; results in item order.

  local      a pool of threads in this process (default). The parse runs in C without the GIL
             and polars/numpy release it too, so ranks parse in parallel while the job pays
             for one interpreter: measured on 8x200 MB, one process instead of 1 + N workers
             each holding their own polars/numpy, and no worker start-up on cached loads.
             From the command line on Linux (`analyze`, `diff`, `mfu`), one of the N workers is
             a process forked as the command started (`prefork`): the analyses hand the GIL back
             and forth hundreds of times per rank, and two ranks in two processes do not wait
             for each other's.
  processes  a pool of worker processes, for per-rank work that would hold the GIL.
  inprocess  one rank after the other (debugging, tiny inputs).
  ray        Ray tasks (`pip install 'rankscope[ray]'`): on the cluster at `address`, or on a local
             runtime of `workers` CPUs started for this call. Each task reads its file by path
             (the files must be readable at the same path on every node, and rankscope installed
             there); only the small results travel back to the driver.

The mapped function takes one item (a file) and returns a small picklable result; the driver
never receives event frames.

Ctrl-C: worker processes ignore SIGINT (the terminal sends it to all of them), so only the driver
sees it: it cancels what has not started, stops the pool (terminating worker processes; Ray's
tasks end with the driver's ray.shutdown) and lets the KeyboardInterrupt go on, without a traceback
from any worker. Threads cannot be stopped: those already running finish in the background (the
CLI exits without them). Worker processes also end when the driver is killed (`_worker_start`),
and a local Ray runtime listens on the loopback interface only (`_start_local_ray`).
"""
from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import threading
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterable, TypeVar

from rankscope import prefork
from rankscope.limits import workers_within_limit

T = TypeVar("T")
R = TypeVar("R")

ENGINES = ("auto", "local", "processes", "inprocess", "ray")
RAY_MISSING = "engine ray needs `pip install 'rankscope[ray]'`"
#: Ray re-runs a task whose worker or node died this many times, then reports the item as lost.
RAY_TASK_RETRIES = 2
#: The addresses of the loopback interface: the only ones a local Ray runtime listens on.
LOOPBACK = ("127.0.0.1", "::1", "localhost")
#: How long to try a TCP connection to a Ray address before saying it is unreachable (ray.init
#: itself retries for minutes).
RAY_CONNECT_TIMEOUT_S = 10.0
#: Below this much input (bytes on disk), process start-up costs more than it saves.
AUTO_INPROCESS_BELOW_BYTES = 16 << 20
#: On Ctrl-C, how long to wait for each terminated worker process and for the pool to wind down.
STOP_WAIT_S = 5.0


def default_workers() -> int:
    """Usable CPU cores; one under an address-space limit (`rankscope.limits`)."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS / Windows
        cores = max(1, os.cpu_count() or 1)
    return workers_within_limit(cores)


class EngineError(RuntimeError):
    """The engine cannot run here (not installed, cluster unreachable); the message is one line."""


def choose_engine(engine: str, total_bytes: int, n_items: int, workers: int, address: str | None = None) -> str:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if address and engine not in ("auto", "ray"):
        raise EngineError(f"a Ray address ({address}) needs engine ray, not {engine}")
    if address:
        return "ray"
    if engine != "auto":
        return engine
    if n_items <= 1 or workers <= 1 or total_bytes < AUTO_INPROCESS_BELOW_BYTES:
        return "inprocess"
    return "local"


def map_ranks(fn: Callable[[T], R], items: Iterable[T], engine: str = "local", workers: int | None = None,
              on_done: Callable[[int, R], None] | None = None, address: str | None = None,
              on_lost: Callable[[T, str], R] | None = None, keep_memory: bool = False) -> list[R]:
    """Apply `fn` to every item; results in item order. `on_done(i, result)` runs in the driver
    as each finishes (progress bars). `on_lost(item, why)` stands in for the result of an item
    whose worker died (Ray, after its retries); without it that raises EngineError.
    `keep_memory`: where several items run in this process (local, inprocess), the memory of one
    rank serves the next (`rankscope.ingest.reuse`; the worker process always keeps it)."""
    items = list(items)
    n = min(workers or default_workers(), len(items))
    worker = prefork.worker()
    if worker is not None and (engine != "local" or n < 2):
        worker.stop()             # of no use to this map: its CPU and memory back now
        worker = None
    if not items:
        return []
    if engine == "ray":
        return _map_ray(fn, items, workers, on_done, address, on_lost)
    results: list = [None] * len(items)
    if engine == "inprocess" or len(items) <= 1:
        with _kept_between_ranks(keep_memory and len(items) > 1):
            for i, item in enumerate(items):
                results[i] = fn(item)
                if on_done:
                    on_done(i, results[i])
        return results
    if engine == "local":
        with _kept_between_ranks(keep_memory):
            return _map_local(fn, items, n, on_done, worker)
    ctx = mp.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
    if ctx.get_start_method() == "forkserver":
        _start_forkserver_sigint_blocked()
    driver_alive, alive = ctx.Pipe(duplex=False)    # the workers' end, and the one only this process holds
    pool = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_worker_start, initargs=(driver_alive,))
    try:
        with _sigint_held():
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
        for fut in as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            if on_done:
                on_done(i, results[i])
    except BaseException:         # Ctrl-C, or `fn` raised: nothing more is started
        _stop(pool)
        raise
    else:
        pool.shutdown()
    finally:
        alive.close()
        driver_alive.close()
    return results


def _kept_between_ranks(keep: bool) -> contextlib.AbstractContextManager:
    """Around ranks run one after another in this process: `reuse.between_ranks()` when `keep` (a
    single rank has no next one, and would only hold more memory: a 1 GB rank's `analyze` peaked
    at 0.87x the file instead of 0.76x). Imported here: the engine itself needs no numpy."""
    if not keep:
        return contextlib.nullcontext()
    from rankscope.ingest import reuse
    return reuse.between_ranks()


def _map_local(fn: Callable[[T], R], items: list[T], n: int, on_done,
               worker: prefork.WorkerProcess | None) -> list[R]:
    """The local engine: `n` threads take the items in turn and run `fn` here; with the command
    line's worker process (`prefork`), one of them hands its items to that process instead, once it
    is ready (if it is lost, that thread runs its item and the rest here). Results are collected,
    and `on_done` called, in this thread, as they finish. After a failure or a Ctrl-C nothing more
    is started; threads already running finish in the background."""
    results: list = [None] * len(items)
    taken = threading.Lock()
    stop = threading.Event()
    finished: queue.SimpleQueue = queue.SimpleQueue()
    next_item = [0]

    def take() -> int | None:
        with taken:
            if stop.is_set() or next_item[0] == len(items):
                return None
            next_item[0] += 1
            return next_item[0] - 1

    def settle(i: int, call: Callable, arg) -> None:
        """call(arg), item i's result, or what it raised (then nothing more is started), to the queue."""
        try:
            finished.put((i, call(arg), None))
        except BaseException as exc:
            finished.put((i, None, exc))
            stop.set()

    def thread_worker() -> None:
        while (i := take()) is not None:
            settle(i, fn, items[i])

    def in_worker_process(i: int) -> R:
        assert worker is not None         # only with a worker process
        try:
            return worker.run(fn, items[i])
        except prefork.WorkerLost:
            return fn(items[i])       # here; and the rest too, below

    def worker_process_feeder() -> None:
        assert worker is not None         # only with a worker process
        if worker.wait_ready(lambda: stop.is_set() or next_item[0] == len(items)):
            while not worker.lost and (i := take()) is not None:
                settle(i, in_worker_process, i)
        thread_worker()               # not ready, or lost: the rest here

    targets = [thread_worker] * n if worker is None else [thread_worker] * (n - 1) + [worker_process_feeder]
    threads = [threading.Thread(target=t, name=f"rankscope_{k}", daemon=True) for k, t in enumerate(targets)]
    for t in threads:
        t.start()
    try:
        for _ in range(len(items)):
            i, result, exc = finished.get()
            if exc is not None:
                raise exc
            results[i] = result
            if on_done:
                on_done(i, result)
    except BaseException:         # Ctrl-C, or `fn` raised: nothing more is started, the worker process ends
        stop.set()
        if worker is not None:
            worker.stop()
        raise
    if worker is not None and not worker.ready:   # the map was over before it was ready (cached ranks)
        worker.stop()
    return results


def _worker_start(driver_alive) -> None:
    """How a worker process of the pool starts: it ignores Ctrl-C (the driver decides), and it ends
    as soon as the driver has ended, however it ended (SIGTERM or SIGKILL of the driver alone, as
    `timeout` and Kubernetes send): a thread waits on `driver_alive`, the reading end of a pipe
    whose only writing end the driver holds, for the end of file its death brings. (The pool's own
    pipes keep an idle worker waiting for ever; a parent-death signal would not do: the workers'
    parent is the forkserver, which lives as long as they do.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        try:
            driver_alive.recv_bytes()
        except (EOFError, OSError):
            pass
        os._exit(1)

    threading.Thread(target=watch, name="rankscope_driver_watch", daemon=True).start()


@contextlib.contextmanager
def _sigint_held():
    """A Ctrl-C inside the block is raised as it ends: submitting starts worker processes, and
    one interrupted between its start and the pool's record of it would outlive the pool (and
    print a traceback once the pool's queues are gone). Only the main thread can hold it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        previous(signal.SIGINT, caught[0])


def _start_forkserver_sigint_blocked() -> None:
    """Workers are forked from the forkserver with its signal mask: started while this thread
    blocks SIGINT, the server and every worker it forks hold a Ctrl-C pending from birth, and their
    ignoring it (the server's own, the workers' initializer) discards it; without the block, a
    Ctrl-C while a worker still imports printed that worker's traceback. The resource tracker is
    started first: its start unblocks SIGINT in this thread. This process keeps a handler
    meanwhile (not SIG_IGN: a library thread that does not block SIGINT, such as polars', would
    take the signal and drop it), and a Ctrl-C it catches is raised once the server runs. Only the
    main thread can do this (the forkserver is a POSIX start method); elsewhere the initializer
    alone protects the workers."""
    if threading.current_thread() is not threading.main_thread():
        return
    from multiprocessing import forkserver, resource_tracker
    resource_tracker.ensure_running()
    with _sigint_held():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            forkserver.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel the pool's pending work; terminate its worker processes and wait for them.

    A worker killed while it was sending its result leaves half a message in the result pipe; the
    pool's manager thread would wait for the rest for ever, since this process still holds a
    writing end. Closing that end once the workers are dead turns the wait into an end of file,
    and the pool winds down (its semaphores released, so none is reported leaked at exit)."""
    processes = list((pool._processes or {}).values())
    for p in processes:
        p.terminate()
    for p in processes:
        p.join(STOP_WAIT_S)
    manager = getattr(pool, "_executor_manager_thread", None)
    if processes:
        pool._result_queue._writer.close()  # type: ignore[attr-defined]  # its pipe's end (typeshed: no such attribute)
    pool.shutdown(wait=False, cancel_futures=True)
    if manager is not None:
        manager.join(STOP_WAIT_S)


def _map_ray(fn, items: list, workers: int | None, on_done, address: str | None, on_lost) -> list:
    """Ray tasks over `fn`, gathered with ray.wait as they finish. Uses the Ray runtime this process
    is already connected to, else connects to `address`, else starts a local one of `workers` CPUs;
    what it started or connected to, it shuts down."""
    try:
        import ray
        import ray.exceptions
    except ImportError:
        raise EngineError(RAY_MISSING) from None
    started = not ray.is_initialized()
    if started:
        quiet: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
        try:
            if address:
                _check_reachable(address)
                ray.init(address=address, **quiet)
            else:
                _start_local_ray(ray, workers or default_workers(), quiet)
        except EngineError:
            raise
        except Exception as exc:  # ray raises ConnectionError, RuntimeError, ValueError ...
            where = f"the Ray cluster at {address}" if address else "a local Ray runtime"
            raise EngineError(f"cannot start or reach {where}: {_first_line(exc)}") from None
    interrupted = False
    try:
        task = ray.remote(num_cpus=1, max_retries=RAY_TASK_RETRIES)(fn)
        index = {task.remote(item): i for i, item in enumerate(items)}
        results: list = [None] * len(items)
        pending = list(index)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)           # block for one,
                if pending:                                                # then take all that are done
                    more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                    ready += more
                for ref in ready:
                    i = index[ref]
                    try:
                        results[i] = ray.get(ref)
                    except ray.exceptions.RayTaskError:
                        raise                      # `fn` itself raised: as with the other engines
                    except ray.exceptions.RayError as exc:   # its worker or node died, after the retries
                        why = f"lost on Ray: {_first_line(exc)}"
                        if on_lost is None:
                            raise EngineError(why) from None
                        results[i] = on_lost(items[i], why)
                    if on_done:
                        on_done(i, results[i])
        except BaseException:     # Ctrl-C, or `fn` raised: a cluster would still run the others
            if not started:       # ray.shutdown() below ends the tasks of a driver this call connected;
                for ref in pending:   # cancelling them as they complete can abort Ray's core (exit 1)
                    ray.cancel(ref, force=True)
            raise
        return results
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if started:
            # after a Ctrl-C, Ray's core logs the tasks it could not report back while it stops
            with _stderr_silenced() if interrupted else contextlib.nullcontext():
                ray.shutdown()


def _start_local_ray(ray, cpus: int, options: dict) -> None:
    """A Ray runtime on this machine for this call, reachable from it alone, which a Ctrl-C during
    its start leaves nothing of.

    Loopback only: Ray's own setting for a runtime of one machine (what RAY_ENABLE_WINDOWS_OR_OSX_
    CLUSTER=0 sets when ray is imported) holds while it starts, so the node's address is 127.0.0.1
    and every server of the runtime (GCS, raylet, its agents, workers, this driver) listens there
    only; the dashboard stays off. Checked once started: a runtime on another address is shut down
    (EngineError).

    Ctrl-C: the runtime's processes are started with SIGINT blocked, which they keep, so the
    terminal's Ctrl-C (sent to the whole process group) reaches this process alone, which shuts the
    runtime down (Ray's agents that took it themselves could outlive the run). A Ctrl-C while the
    runtime starts is raised once it runs, then it is shut down."""
    from ray._private import ray_constants
    clusters = getattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    try:
        with _sigint_held():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            ray_constants.ENABLE_RAY_CLUSTER = False
            try:
                ray.init(address="local", num_cpus=cpus, _node_ip_address=LOOPBACK[0], **options)
            finally:
                ray_constants.ENABLE_RAY_CLUSTER = clusters
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    except KeyboardInterrupt:
        if ray.is_initialized():
            with _stderr_silenced():
                ray.shutdown()
        raise
    where = ray.util.get_node_ip_address()
    if where not in LOOPBACK:
        ray.shutdown()
        raise EngineError(f"a local Ray runtime would listen on {where}, not only on this machine's loopback "
                          "interface: not started")


@contextlib.contextmanager
def _stderr_silenced():
    """File descriptor 2 on /dev/null for the block (what C code writes there is dropped)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _check_reachable(address: str) -> None:
    """A HOST:PORT address (optionally ray://) must accept a TCP connection; others ("auto") are
    left to Ray."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise EngineError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None
