"""Run a CPU kernel body over slices of one axis on several threads.

numpy releases the GIL inside its array loops, so the copies of im2col / col2im and the strided ufuncs of
pooling run in parallel when each thread takes its own slice of channels or images. Only BLAS used the
second core before; these bodies were single-threaded. Each slice is computed by the same body with the
same operations in the same order as the whole, so the result is bit-identical for any thread count.

The thread count follows the BLAS setting, so that MPI ranks and CGDP workers, which divide the cores by
setting ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` (layerforge.cores), divide these threads too:
the BLAS library's own count (threadpoolctl) where it can be read, else those variables, else the cores.
:func:`set_num_threads` overrides it (tests, benchmarks).

Products that the batch-invariance switch shares between the kernel threads (kernels/blas.py, kernels/thin_gemm.py)
go to product threads instead (:func:`run_jobs`): each piece is a job, a row of integers that compiled code runs
(kernels/_product_jit.py), and a product thread waits for its next job in compiled code, without the GIL. A job
reaches it in about a microsecond where :func:`parallel_for` hands a piece over in 50-100 us (a sleeping thread's
wake-up and the GIL on these machines), which is what sharing LeNet's and ResNet-50's products at batch 1 needs.
"""
import functools
import os
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import numpy

from ..backend import get_array_module

# Below this many elements per array operation of a body, a kernel runs on the calling thread. Handing out
# the slices costs about 60 us per call on the 2-core machine (measured with an empty body) and every
# numpy call of a body pays its Python overhead once per thread; a 64K-element float32 copy takes about
# 11 us, so with a body's several passes this is where the second core starts to win (a global 7x7 average
# pool of ResNet-50, 16K outputs per pass, ran slower on 2 threads; im2col of 400K per tap, 1.3x faster).
MIN_PARALLEL_ELEMENTS = 1 << 16

# seconds parallel_for waits for its other pieces once a signal has cut the calling thread short: a piece takes
# milliseconds (a first call's compile, seconds); one still running after this may wait for what the signal left held
INTERRUPTED_PIECES_WAIT = 2.0

_state = {"threads": None, "pool": None}
_inside = threading.local()


def _blas_threads():
    try:
        from threadpoolctl import threadpool_info

        counts = [info["num_threads"] for info in threadpool_info() if info.get("user_api") == "blas"]
        if counts:
            return max(counts)
    except Exception:  # noqa: BLE001 - threadpoolctl missing or unable to read a library: use the variables
        pass
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(var, "").split(",")[0]
        if value.isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


def num_threads():
    """Threads the kernels use (the BLAS thread count unless :func:`set_num_threads` chose one)."""
    if _state["threads"] is None:
        _state["threads"] = max(1, _blas_threads())
    return _state["threads"]


def set_num_threads(n):
    """Use ``n`` threads from now on (None: follow the BLAS setting again)."""
    _state["threads"] = None if n is None else max(1, int(n))


def _pool(workers):
    pool = _state["pool"]
    if pool is None or pool._max_workers < workers:
        if pool is not None:
            pool.shutdown(wait=True)
        pool = _state["pool"] = _started_pool(workers)
    return pool


def _started_pool(workers):
    """A ThreadPoolExecutor of ``workers`` threads, every one started now. concurrent.futures starts a thread
    within a submit and registers it for the interpreter's exit (which wakes and joins it) only once ``start()`` has
    returned: a Ctrl-C that errors.interrupting raised in between left a thread that the exit then waited for forever
    (``interrupted by SIGINT``, and no exit). Started here, an interrupt shuts the pool down, which wakes every
    thread it started, registered or not (they all read its queue); later submits start none."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="layerforge-kernel")
    go = threading.Event()
    try:
        started = [_submitted(pool, go.wait) for _ in range(workers)]  # none is idle before go: a thread per submit
    except BaseException:
        go.set()
        pool.shutdown(wait=False)
        raise
    go.set()
    _join(started)
    return pool


def _submitted(pool, fn, *args):
    """``fn(*args)`` on a thread of ``pool``: ``(lock, failures)``, the lock held until it has run (its end waited
    for by taking it again: :func:`_join`) and the list its exception goes to. A future is not waited on:
    Future.result takes the future's condition in Python (threading.Condition.__enter__), where an Interrupted
    raised just after the take left it held; the kernel thread then waited for ever to post the result, and the
    command's exit for that thread (``interrupted by SIGINT``, and no exit). Taking a lock holds nothing if a signal
    cuts it short."""
    finished, failures = threading.Lock(), []
    finished.acquire()

    def job():
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - raised by _join, on the thread that waits
            failures.append(e)
        finally:
            finished.release()
    pool.submit(job)
    return finished, failures


def _join(pieces, interrupted=False):
    """Wait for ``pieces`` (:func:`_submitted`'s) to end, then raise the first one's exception. Once a signal has
    cut the caller short (``interrupted``, or a KeyboardInterrupt during this wait), each is waited for a while only
    (:data:`INTERRUPTED_PIECES_WAIT` in all), since one may wait for a lock the signal left held where it came."""
    deadline = time.monotonic() + INTERRUPTED_PIECES_WAIT
    for k, (finished, _) in enumerate(pieces):
        try:
            if interrupted:
                finished.acquire(timeout=max(0.0, deadline - time.monotonic()))
            else:
                finished.acquire()
        except KeyboardInterrupt:
            _join(pieces[k:], interrupted=True)
            raise
    for _, failures in pieces:
        if failures and not interrupted:
            raise failures[0]


def within_parallel_for():
    """Whether the calling thread is running a piece of a :func:`parallel_for` body (whose own calls of it, and
    :func:`run_jobs`', then run on this thread)."""
    return getattr(_inside, "active", False)


def parallel_for(n, body, work):
    """Call ``body(lo, hi)`` for contiguous pieces ``[lo, hi)`` that cover ``range(n)``, in parallel.

    Args:
        n: length of the axis that is split (images, channels).
        body: computes and writes the result for one piece; pieces must not write the same memory.
        work: elements one array operation of the body touches for the whole range (one tap's copy, one
            pass over the outputs); below :data:`MIN_PARALLEL_ELEMENTS` the call runs on the calling
            thread, as do calls made from inside a body.
    """
    threads = min(num_threads(), n)
    if threads <= 1 or work < MIN_PARALLEL_ELEMENTS or within_parallel_for():
        body(0, n)
        return
    parked = bool(_products["threads"])
    if parked:
        _park_product_threads()
    bounds = [n * k // threads for k in range(threads + 1)]

    def run(lo, hi):
        _inside.active = True
        try:
            body(lo, hi)
        finally:
            _inside.active = False

    pieces = [_submitted(_pool(threads - 1), run, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    try:
        run(bounds[0], bounds[1])
    except BaseException as e:  # this piece's error wins, once the others have ended
        _join(pieces, interrupted=isinstance(e, KeyboardInterrupt))
        raise
    finally:
        if parked:  # spinning again by the next product: a futex wake-up takes it tens of microseconds
            _wake_product_threads()
    _join(pieces)


# cycles a product thread waits for its next job before it sleeps (about 1.6 ms at 2.6 GHz: LeNet's layers between
# one product and the next at batch 10; 0.2 ms cost its pass 10%, a futex wake-up on every product), and the calling
# thread's spin for a job before it lets other threads run between its looks. A waiting product thread gives its
# core to any thread that wants it every few microseconds (sched_yield), and parallel_for asks it to sleep at once
SPIN_CYCLES, WAIT_CYCLES = 1 << 22, 1 << 22
_products = {"threads": None, "boxes": None, "lock": threading.Lock()}


class _ProductThread:
    """A kernel thread that waits for pieces of products in compiled code, without the GIL (kernels/_product_jit.py):
    a job reaches it in about a microsecond where parallel_for hands a piece over in 50-100 us (a sleeping thread's
    wake-up and the GIL). It spins for :data:`SPIN_CYCLES` after its last job, then sleeps on a futex."""

    def __init__(self, jit):
        import ctypes

        self.jit = jit
        # memory never freed: the thread runs until the process ends, after the interpreter has freed its objects
        libc = ctypes.CDLL(None)
        libc.calloc.restype = ctypes.c_void_p
        words = jit.JOB + jit.FIELDS
        self.box = numpy.ctypeslib.as_array((ctypes.c_int64 * words).from_address(libc.calloc(words, 8)))
        self.box[jit.STATE] = jit.AWAKE
        # compiled (or loaded from numba's cache) here, not in the thread: a daemon thread still compiling when the
        # interpreter exits crashes it (a short first run under the switch)
        import numba
        jit.serve.compile((numba.typeof(self.box), numba.int64, numba.int64, numba.int64))
        threading.Thread(target=self._serve, name="layerforge-product", daemon=True).start()

    def _serve(self):
        self.jit.serve(self.box, SPIN_CYCLES, _syscall(), self.jit.execute_job.address)


@functools.cache
def _syscall():
    """The address of libc's ``syscall`` (product threads sleep and wake through futexes), or 0 off Linux x86-64."""
    import ctypes
    import platform

    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return 0
    return ctypes.cast(ctypes.CDLL(None).syscall, ctypes.c_void_p).value


def product_jit():
    """kernels/_product_jit.py (its job fields and kinds), imported at the first shared product: numba's import costs
    commands that share none."""
    module = _products.get("jit")
    if module is None:  # an import statement costs a few microseconds even when done: LeNet's products take 5-300
        from . import _product_jit as module
        _products["jit"] = module
    return module


def run_jobs(jobs):
    """Compute the pieces of a product that ``jobs`` describe (kernels/_product_jit.py's jobs, a list of them or an
    int64 array of rows; pieces that write disjoint memory): the first on the calling thread, the others each on a
    product thread (on the calling thread too where none is free: another thread is sharing a product, or the kernels
    use one thread). One compiled call posts, computes and waits (_product_jit.run)."""
    jit = product_jit()
    jobs = numpy.ascontiguousarray(jobs, numpy.int64)  # rows of FIELDS words, as _product_jit.run reads them
    lock = _products["lock"]
    wanted = min(len(jobs), num_threads()) - 1 if _syscall() else 0
    if wanted > 0 and not within_parallel_for() and lock.acquire(blocking=False):
        try:
            started = _products["threads"] = _products["threads"] or []
            if len(started) < wanted:
                try:
                    started.extend(_ProductThread(jit) for _ in range(wanted - len(started)))
                finally:  # the mailboxes of the threads started, every one of which is serving
                    _products["boxes"] = numpy.array([t.box.ctypes.data for t in started], numpy.int64)
            jit.run(_products["boxes"][:wanted], jobs, _syscall(), WAIT_CYCLES, jit.execute_job.address)
        finally:
            lock.release()
    else:
        jit.run(_NO_BOXES, jobs, 0, WAIT_CYCLES, jit.execute_job.address)


_NO_BOXES = numpy.zeros(0, numpy.int64)


def _wake_product_threads():
    jit = product_jit()
    for thread in _products["threads"]:
        jit.wake(thread.box, _syscall())


def _park_product_threads():
    jit = product_jit()
    for thread in _products["threads"]:
        jit.park(thread.box)


def _forget_product_threads():
    # a forked child has none of its parent's threads
    _products["threads"], _products["boxes"], _products["lock"] = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget_product_threads)


def elementwise(fn, *arrays):
    """``fn(*pieces)`` over matching pieces of axis 0 of same-shaped arrays, on the kernel threads for numpy
    arrays (copies and adds of whole activations: Eltwise, Split); one call ``fn(*arrays)`` for cupy."""
    first = arrays[0]
    if not isinstance(first, numpy.ndarray) or first.ndim == 0:
        fn(*arrays)
        return
    parallel_for(len(first), lambda lo, hi: fn(*(a[lo:hi] for a in arrays)), work=first.size)


def fill_zeros(arrays):
    """Write zeros into the numpy ``arrays`` (contiguous, of any sizes) on the kernel threads, each zeroing a run of
    about equal bytes across them: a net's parameter diffs before an iteration (ResNet-50's 102 MB: 12 ms on one of
    two cores, about half that on both)."""
    flats = [a.reshape(-1) for a in arrays]
    total = sum(f.size for f in flats)
    threads = num_threads() if total >= MIN_PARALLEL_ELEMENTS else 1

    def run(lo, hi):
        for k in range(lo, hi):
            start, stop, offset = total * k // threads, total * (k + 1) // threads, 0
            for f in flats:
                a, b = max(start - offset, 0), min(stop - offset, f.size)
                if a < b:
                    f[a:b] = 0
                offset += f.size
    parallel_for(threads, run, work=total)


def into_contiguous(out, fill):
    """``fill(target)`` with a C-contiguous ``target`` standing for the numpy array ``out``: ``out`` itself, or
    a scratch array copied into ``out`` afterwards (the compiled kernels index their outputs as contiguous)."""
    target = out if out.flags.c_contiguous else numpy.empty(out.shape, out.dtype)
    fill(target)
    if target is not out:
        out[...] = target
    return out


def sum_into(out, *arrays):
    """``out = arrays[0] + arrays[1] + ...`` (same shapes; ``out`` may be ``arrays[0]``), on the kernel threads
    for numpy arrays: Eltwise SUM's forward and Split's gradient."""
    elementwise(_sum_into, out, *arrays)


def _sum_into(out, *arrays):
    if len(arrays) == 1:
        out[...] = arrays[0]
        return
    get_array_module(out).add(arrays[0], arrays[1], out=out)
    for a in arrays[2:]:
        out += a


def cpu_kernel(fn=None, *, reassociate=True, ieee_division=False):
    """Compile a CPU kernel body with numba: nopython, releasing the GIL (so :func:`parallel_for`'s threads run
    it side by side), cached on disk (each function compiled by one process of the machine at a time:
    kernels/compile_lock.py). Used where numpy would need several passes or a pass per window
    position for what one loop does; each body computes its slice in a fixed order, so results stay
    bit-identical for any thread count. Floating-point reductions may be reassociated (vectorised), always
    the same way for the same lengths; ``@cpu_kernel(reassociate=False)`` forbids that, for a body that must give
    the bits of the separate passes it fuses (reassociation would fold one pass's factor into the next's).
    ``ieee_division=True``: a float division by zero gives inf or nan, as numpy's does, where numba would raise; the
    check numba makes before each division otherwise keeps a loop with one from being vectorised. numba
    is imported at the first call (it takes a quarter of a second, which commands that run no kernel, and every
    rank's start, would pay)."""
    if fn is None:
        return functools.partial(cpu_kernel, reassociate=reassociate, ieee_division=ieee_division)
    compiled = []
    lock = threading.Lock()

    def dispatcher():
        if not compiled:
            with lock:
                if not compiled:
                    from . import compile_lock

                    fastmath = {"reassoc"} if reassociate else False
                    errors = "numpy" if ieee_division else "python"
                    compiled.append(compile_lock.njit(nogil=True, fastmath=fastmath, error_model=errors)(
                        _calling_kernels(fn)))
        return compiled[0]

    @functools.wraps(fn)
    def call(*args):
        return (compiled[0] if compiled else dispatcher())(*args)
    call.dispatcher = dispatcher
    return call


def _calling_kernels(fn):
    """``fn`` with the kernels it calls by name (other :func:`cpu_kernel` functions) seen as their compiled selves, so
    that a kernel may run another's loop as a step of its own (a channel's sums, then its gradient)."""
    names = [name for name in fn.__code__.co_names if callable(getattr(fn.__globals__.get(name), "dispatcher", None))]
    if not names:
        return fn
    namespace = dict(fn.__globals__, **{name: fn.__globals__[name].dispatcher() for name in names})
    return types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)


def host_work(array, passes=1):
    """``array.size // passes`` for a numpy array, 0 for a device array (cupy orders its own work)."""
    return array.size // passes if isinstance(array, numpy.ndarray) else 0
