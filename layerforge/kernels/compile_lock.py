"""numba's compiling, one process of a machine at a time for each function: ``mpiexec -n 8`` on a cold cache
compiles each kernel once and the other ranks load it, where all eight compiled it side by side.

numba's on-disk cache (``cache=True``) is written without a lock: processes that compile the same function at the
same moment each compile it, and each rewrites the function's index (``.nbi``), so one process's entry can be lost
or point at another's data file (numba issue #10128: a file lock is the maintainers' suggested fix). Here a
function's compiles take an exclusive ``flock`` on a file beside its cache entries (``<name>-<line>.lock``), numba's
own compile (look in the cache, else compile and save) runs under it, and the next process to take it finds the
entry saved. The kernel modules compile through :func:`njit` and :func:`cfunc` below instead of numba's decorators.

A lock not had within :data:`WAIT_SECONDS` (its holder stopped by a signal, a cache on a file system without
``flock``) is done without: numba compiles as it would alone. Nested compiles (a kernel that calls another) take
their callees' locks in call order, under numba's process-wide compiler lock, so two processes never wait on each
other in a circle.

numba takes its compiler lock, and llvmlite its lock around every call into LLVM, in Python-level ``__enter__``
methods: an Interrupted (errors.interrupting: a Ctrl-C) raised on the main thread between the acquire and the
block's start leaves it held, and the next kernel thread to compile waited for it for ever, as did the interrupted
thread, which waits for its kernel threads, or the command's exit (``layerforge train`` silent after a Ctrl-C in
AUTO's first timing). So an exception leaving the main thread's outermost compile, and a signal ending the command,
let both go (:func:`let_go_of_held_locks`); and a kernel thread waiting for another process's compile stops
waiting once a signal ends the command.
"""
import contextlib
import functools
import os
import threading

import numba
from numba.core import sigutils
from numba.core.caching import FunctionCache
from numba.core.compiler_lock import global_compiler_lock

from ..errors import after_interrupt, raise_if_ending
from .file_lock import locked_file

# longest wait for another process's compile of one function, in seconds: one takes 0.1-3 s here, a few times that
# on a loaded machine; a holder stopped mid-compile (a rank the deadline tests stop) costs the others this much
WAIT_SECONDS = 10.0
_held = set()  # the lock paths this process holds (a function compiled again within its own compile: recursion)


@functools.cache
def target_features():
    """The CPU features numba compiles for, as LLVM names them (``avx512f``, ``avx512bf16``...): those of
    ``NUMBA_CPU_FEATURES`` where it is set, else the host's, as numba takes them. A kernel written for a feature
    checks it here rather than in /proc/cpuinfo: ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=`` compiles for AVX2 on
    any CPU."""
    features = numba.core.config.CPU_FEATURES
    if features is None:
        from llvmlite import binding
        features = binding.get_host_cpu_features().flatten()
    return frozenset(f[1:] for f in features.split(",") if f.startswith("+"))


def lock_path(py_func):
    """The lock file of ``py_func``'s compiles: in the folder numba caches it in (beside the checkout's sources, or
    ``NUMBA_CACHE_DIR``); None where numba finds no cache folder for it."""
    try:
        folder = FunctionCache(py_func).cache_path
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return None
    return os.path.join(folder, f"{py_func.__qualname__}-{py_func.__code__.co_firstlineno}.lock")


@contextlib.contextmanager
def compiling(path):
    """Hold the machine-wide lock at ``path`` (None: none) for a compile; re-entrant within this process."""
    outermost = threading.current_thread() is threading.main_thread() and not global_compiler_lock.is_locked()
    try:
        with global_compiler_lock:
            if path is None or path in _held:  # no lock, or this process's own (its outermost hold lets it go)
                yield
                return
            # not had in time: compiled without it, as numba alone would
            with locked_file(path, WAIT_SECONDS, polled=raise_if_ending):
                _held.add(path)
                try:
                    yield
                finally:
                    _held.discard(path)
    except BaseException:
        if outermost:
            let_go_of_held_locks()
        raise


def let_go_of_held_locks():
    """Let go of numba's compiler lock and llvmlite's LLVM lock where the calling thread holds them, however many
    times: for a thread that holds them only where a signal cut a take short (see above), outside any compile."""
    from llvmlite.binding import ffi

    for lock in (global_compiler_lock._lock, ffi.lib._lock._lock):
        if lock._is_owned():
            lock._release_save()  # every take at once, as threading.Condition.wait does


after_interrupt(let_go_of_held_locks)


def locked(dispatcher):
    """``dispatcher`` (a numba Dispatcher with ``cache=True``), its compiles of signatures it lacks taken under its
    machine-wide lock: numba calls ``compile`` for a call with new argument types and when a caller is typed."""
    path, compile_unlocked = lock_path(dispatcher.py_func), dispatcher.compile

    def compile(sig):
        args, _ = sigutils.normalize_signature(sig)
        if tuple(args) in dispatcher.overloads:
            return compile_unlocked(sig)
        with compiling(path):
            return compile_unlocked(sig)
    dispatcher.compile = compile
    return dispatcher


def njit(*signatures, **options):
    """``numba.njit(**options, cache=True)`` whose compiles take the function's machine-wide lock; with
    ``signatures``, compiled for those now and for no others (as ``numba.njit(signatures)``)."""
    def decorate(fn):
        with compiling(None):  # the process's first dispatcher sets numba's target up, under its compiler lock
            dispatcher = locked(numba.njit(cache=True, **options)(fn))
        for sig in signatures:
            dispatcher.compile(sig)
        if signatures:
            dispatcher.disable_compile()
        return dispatcher
    return decorate


def cfunc(signature, **options):
    """``numba.cfunc(signature, **options, cache=True)``, compiled (now) under the function's machine-wide lock."""
    def decorate(fn):
        with compiling(lock_path(fn)):
            return numba.cfunc(signature, cache=True, **options)(fn)
    return decorate
