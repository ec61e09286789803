"""Decode workers: processes that read, decode and crop a batch's records straight into shared memory.

Processes, not threads (docs/data.md has the measurements). cv2.imdecode releases the GIL, and two threads
decode JPEGs twice as fast as one, but only when nobody catches what OpenCV and libjpeg print on fd 2. That
capture, which turns "Corrupt JPEG data" into a warning naming the record, redirects the process's one fd 2
around each decode, so it must keep a process's decodes apart: two threads with it decode no faster than one.
A worker process points its own fd 2 at a private file once and reads each record's messages from it, so
its decodes need no lock. Processes also keep each record's Python work (the LMDB read, the Datum parse,
the crop's bookkeeping) off the training loop's GIL, which counts at 16 workers and more.

Forked (``os.fork``), not spawned: a worker starts in milliseconds and inherits what it reads from (the list of
records, an image cache) without pickling or importing anything again, and a user's script that builds a net at
import time is not run again in each worker (spawn and forkserver run it). multiprocessing's Process is not
used: it refuses children to a daemonic process, which a CGDP worker is. The workers use only numpy, OpenCV on
one thread and an LMDB environment of their own, never the parent's CUDA context, BLAS threads or locks, and
leave by ``os._exit`` (the parent's exit handlers are not theirs to run).

The batches live in a ring of ``slots`` in one shared anonymous mapping. A batch's records are split into one
contiguous chunk per worker; each worker receives its chunks in order through its pipe, fills them and answers
with the seconds it took, the warnings it logged and an error, if any. The consumer takes batches in order and
hands a slot back when it asks for the next batch. Which worker fills which record does not change a value of
the batch: every record is put at its own place, from a plan made beforehand from (seed, position).
"""
import atexit
import collections
import logging
import mmap
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
import weakref

import numpy

from .. import trace
from ..errors import DataError, LayerforgeError, describe_exit
from ..kernels.threadpool import num_threads
from .images import catch_stderr_for_good

log = logging.getLogger("layerforge")
WORKERS_ENV = "LAYERFORGE_DECODE_WORKERS"
# Signals that mean a request of the user or a batch system: the parent decides what they mean (the solver
# snapshots on SIGINT / SIGTERM) and closes the workers' pipes, which ends them. A worker leads a process group of
# its own, so what a terminal or a launcher sends to the parent's group reaches the parent alone; one sent to a
# worker itself (``kill PID``, a scheduler signalling every process) goes on to the parent, SIGINT as SIGTERM
# (the same request, never a second Ctrl-C, which would interrupt a process at once).
PARENT_DECIDES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_TO_PARENT = {signal.SIGINT: signal.SIGTERM, signal.SIGTERM: signal.SIGTERM, signal.SIGHUP: signal.SIGHUP}
_ALIGN = 64
_open_pools = weakref.WeakSet()
_exit_hook = []  # atexit's registration, once


def decode_workers(configured=0):
    """How many decode workers a data layer starts.

    ``$LAYERFORGE_DECODE_WORKERS`` when set (the command line's override, 0 there meaning the default whatever
    the key says), else ``configured`` (the layer's ``decode_workers``) when positive, else one per kernel
    thread: the share of the cores this process was given, which BLAS and the kernel thread pool use too (all
    the cores; under mpiexec or CGDP, the cores divided by the processes on the node).
    """
    value = os.environ.get(WORKERS_ENV, "").strip()
    if value:
        if not value.isdigit():
            raise LayerforgeError(f"{WORKERS_ENV} must be a whole number of workers (0: one per core), got {value!r}")
        configured = int(value)
    return configured if configured > 0 else num_threads()


class DecodePool:
    """``workers`` forked processes filling a ring of ``slots`` batches in shared memory.

    Args:
        fill: ``fill(arrays, item)`` puts one record into a batch's ``arrays`` (runs in a worker; raises
            DataError naming the record).
        layout: ``[(shape, dtype), ...]`` of a batch's arrays.
        slots: batches in flight (at least 1).
        workers: processes.
        name: what the pool serves, for messages (``layer 'data' (Data)``).
        describe: ``describe(item)`` names an item's record, for a worker that died on it.
        setup: called once in each worker before its first record (e.g. to open the database afresh).
        stats: an InputStats that receives the workers' seconds and the consumer's waits.
        span: the name of its trace spans (the layer's name): the loop's waits (``data``, on the compute
            row) and each chunk a worker filled (``decode``, on rows ``data``, ``data 1``, ... one per worker).
        returns: ``fill`` returns a small picklable value per record (a record's boxes, an image whose shape
            is not the batch's) that comes back through the worker's pipe; :meth:`batches` then hands out
            ``(extra, values)`` in place of ``extra``, ``values`` in the items' order.
    """

    def __init__(self, fill, layout, slots, workers, name, describe=str, setup=None, stats=None, span="data",
                 returns=False):
        self.name, self.describe, self.stats, self.workers, self.span = name, describe, stats, workers, span
        self.returns = returns
        layout = [(tuple(shape), numpy.dtype(dtype)) for shape, dtype in layout]
        sizes = [-(-int(numpy.prod(shape)) * dtype.itemsize // _ALIGN) * _ALIGN for shape, dtype in layout]
        self.memory = mmap.mmap(-1, max(1, slots * sum(sizes) + 8 * workers))  # shared with forked children
        offsets = numpy.cumsum([0] + sizes * slots)
        self.slots = [[numpy.ndarray(shape, dtype, self.memory, int(offsets[k * len(layout) + a]))
                       for a, (shape, dtype) in enumerate(layout)] for k in range(slots)]
        self.progress = numpy.ndarray(workers, numpy.int64, self.memory, int(offsets[-1]))  # item each worker is on
        self.owed = [collections.deque() for _ in range(workers)]  # per worker: (slot, chunk, start) not answered
        self.pending, self.errors = [0] * slots, {}
        self.values = [[] for _ in range(slots)]  # per slot, what fill returned for each item (``returns``)
        self.conns, self.pids, self.exit_codes = [], [], {}
        self._start(fill, setup)

    def _start(self, fill, setup):
        _open_pools.add(self)  # before the forks: each worker closes the parent's ends of the pipes made before it
        if not _exit_hook:
            _exit_hook.append(atexit.register(_close_open_pools))
        parent = os.getpid()
        # a signal arriving between the fork and the worker's own handlers would kill it with a traceback
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, PARENT_DECIDES)
        # one OpenCV thread per worker, set here: a forked child that changes the count of a pool the parent has
        # started waits forever for the pool's threads, which did not cross the fork
        import cv2

        threads = cv2.getNumThreads()
        cv2.setNumThreads(1)
        try:
            for j in range(self.workers):
                ours, theirs = multiprocessing.connection.Pipe()
                sys.stdout.flush(), sys.stderr.flush()  # what is buffered is the parent's to print, once
                pid = os.fork()
                if pid == 0:
                    _worker_main(j, fill, setup, (theirs, ours), self.slots, self.progress, parent, blocked)
                theirs.close()
                self.conns.append(ours)
                self.pids.append(pid)
        finally:
            cv2.setNumThreads(threads)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def submit(self, slot, items):
        """Have the workers fill ``slot`` with ``items`` (one per record, as ``fill`` takes them)."""
        self.errors.pop(slot, None)
        self.values[slot] = [None] * len(items)
        bounds = [len(items) * j // self.workers for j in range(self.workers + 1)]
        for j, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if hi > lo:
                chunk = items[lo:hi]
                self.owed[j].append((slot, chunk, lo))
                self.pending[slot] += 1
                try:
                    self.conns[j].send((slot, chunk))
                except OSError:
                    pass  # the worker is gone: its sentinel tells, in wait()

    def wait(self, slot):
        """Block until ``slot`` is filled; raises the DataError of a record that failed or a worker that died."""
        start = time.perf_counter()
        while self.pending[slot] and slot not in self.errors:
            self._receive()
        if self.stats is not None:
            self.stats.wait_s += time.perf_counter() - start
        if slot in self.errors:
            raise DataError(self.errors[slot])

    def _receive(self):
        busy = [j for j in range(self.workers) if self.owed[j]]
        ready = multiprocessing.connection.wait([self.conns[j] for j in busy])  # a worker's death closes its end
        for j in busy:
            conn = self.conns[j]
            if conn in ready:
                try:
                    slot, start, seconds, warnings, error, values = conn.recv()
                except (EOFError, OSError):
                    self._died(j)
                    continue
                _, chunk, lo = self.owed[j].popleft()
                self.values[slot][lo:lo + len(values)] = values
                self.pending[slot] -= 1
                # perf_counter is CLOCK_MONOTONIC, one clock for the processes of a host: the worker's start fits
                trace.complete("data", "decode", start, seconds, {"records": len(chunk), "layer": self.span},
                               thread=f"data {j}" if j else "data")
                if self.stats is not None:
                    self.stats.decode_s += seconds
                    self.stats.decoded += len(chunk)
                for message in warnings:
                    log.warning("%s", message)
                if error is not None:
                    k, named, text = error
                    self.errors[slot] = text if named else f"{self.name}: {self.describe(chunk[k])}: {text}"

    def _died(self, j):
        pid = self.pids[j]
        code = self._reap(pid, 2.0)
        _, chunk, _ = self.owed[j][0]  # the first chunk it owes is the one it was filling
        record = self.describe(chunk[min(max(int(self.progress[j]), 0), len(chunk) - 1)])
        message = f"{self.name}: decode worker {j} (pid {pid}) {describe_exit(code)} while reading {record}"
        for slot, _, _ in self.owed[j]:
            self.errors[slot] = message
            self.pending[slot] -= 1
        self.owed[j].clear()

    def batches(self, plan, positions):
        """Batches in the order of ``positions``: ``(arrays, extra)`` for each, where ``plan(position)`` gives
        ``(items, extra)``. Up to ``slots`` batches are filled ahead; a batch's arrays stay valid until the next
        one is asked for. Closing the generator stops the workers."""
        positions = iter(positions)
        queued = collections.deque()
        try:
            for slot in range(len(self.slots)):
                items, extra = plan(next(positions))
                self.submit(slot, items)
                queued.append((slot, extra, len(items)))
            while True:
                slot, extra, count = queued.popleft()
                with trace.wait("data", self.span, records=count):
                    self.wait(slot)
                if self.stats is not None:
                    self.stats.batches += 1
                    self.stats.images += count
                yield self.slots[slot], ((extra, self.values[slot]) if self.returns else extra)
                items, extra = plan(next(positions))
                self.submit(slot, items)
                queued.append((slot, extra, len(items)))
        finally:
            self.close()

    def close(self):
        """Stop the workers (closing their pipes ends them) and wait for them; safe to call more than once."""
        _open_pools.discard(self)
        for conn in self.conns:
            conn.close()
        for pid in self.pids:
            if self._reap(pid, 2.0) is None:
                os.kill(pid, signal.SIGKILL)
                self._reap(pid, None)
        self.conns, self.pids = [], []
        self.owed = [collections.deque() for _ in range(self.workers)]

    def _reap(self, pid, timeout):
        """Worker ``pid``'s exit code (negative: the signal that killed it), waiting up to ``timeout`` seconds
        (None: for good); None if it still runs. Kept in ``exit_codes``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exit_codes:
            try:
                done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): its code is lost
                self.exit_codes[pid] = None
                break
            if done:
                self.exit_codes[pid] = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                return None
            else:
                time.sleep(0.01)
        return self.exit_codes[pid]


def _close_open_pools():
    for pool in list(_open_pools):
        pool.close()


class _Warnings(logging.Handler):
    """Keeps a worker's log records (a warning naming a record) for its next answer, instead of printing them."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def take(self):
        taken, self.messages = self.messages, []
        return taken


def _worker_main(*args):
    """The forked child's whole life: serve, then leave without running the parent's exit handlers."""
    code = 0
    try:
        _serve(*args)
    except BaseException:  # noqa: BLE001 - the parent names this worker when its pipe closes
        traceback.print_exc()  # into the worker's caught fd 2 at worst; its exit code is what the parent reports
        sys.stderr.flush()
        code = 1
    finally:
        os._exit(code)


def _serve(j, fill, setup, ends, slots, progress, parent, mask):
    """Worker ``j``: fill the chunks that arrive on its end of ``ends`` (its, the parent's) until the parent
    closes its end or is gone."""
    os.setpgid(0, 0)

    def to_parent(signum, frame):
        if os.getppid() == parent:  # not a pid the system may have given to another process since
            os.kill(parent, _TO_PARENT[signum])

    for s in PARENT_DECIDES:
        signal.signal(s, to_parent)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    conn = ends[0]
    # the parent's ends of this pipe and of the pipes of the workers forked before: a worker sees its pipe
    # closed only when no other process holds the parent's end
    for other in [ends[1]] + [c for pool in list(_open_pools) for c in pool.conns]:
        other.close()
    keep_images_on_the_heap()
    catch_stderr_for_good()
    warnings = _Warnings()
    logger = logging.getLogger("layerforge")
    logger.handlers, logger.propagate = [warnings], False
    ready = None
    try:
        if setup is not None:
            setup()
    except Exception as e:  # noqa: BLE001 - reported with the first chunk
        ready = _error(0, e)
    while True:
        try:
            while not conn.poll(1.0):
                if os.getppid() != parent:
                    return
            task = conn.recv()
        except (EOFError, OSError):
            return
        slot, chunk = task
        start, error, values = time.perf_counter(), ready, []
        for k, item in enumerate(chunk if error is None else ()):
            progress[j] = k
            try:
                values.append(fill(slots[slot], item))
            except Exception as e:  # noqa: BLE001 - handed to the consumer, which raises it at this batch
                error = _error(k, e)
                break
        progress[j] = -1
        try:
            conn.send((slot, start, time.perf_counter() - start, warnings.take(), error, values))
        except OSError:
            return


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
HEAP_THRESHOLD = 32 * 2 ** 20  # glibc's largest mmap threshold on 64-bit systems


def keep_images_on_the_heap():
    """Make glibc's malloc serve allocations up to 32 MiB from the heap and keep freed heap memory.

    A decoded image (500 x 375 x 3: 560 KB) is above malloc's 128 KiB mmap threshold, so each decode got
    fresh pages from the kernel and faulted every one of them in: cv2.imdecode took 1.30 ms a JPEG instead
    of 0.80 (benchmarks/bench_data.py's set; docs/data.md). A worker decodes one image at a time, so the
    heap holds at most a few images more. Nothing happens where the C library is not glibc.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, 2 * HEAP_THRESHOLD))


def _error(k, e):
    """Item ``k`` failed with ``e``: ``(k, whether the message names the record, message)``."""
    if isinstance(e, LayerforgeError):
        return k, True, str(e)
    return k, False, f"{type(e).__name__}: {e}"
