"""kernels.compile_lock: processes of one machine compile a kernel one at a time, and those that waited load what the
first saved to numba's cache; a lock held too long is done without."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from layerforge.kernels import compile_lock
from tests.test_cli import ROOT, run_python

# a process that compiles relu's _sum_relu for float32 (numba's cache in NUMBA_CACHE_DIR), optionally first holding
# the function's lock until a line comes on stdin, and prints the dispatcher's cache hits and misses
CHILD = """
import json, sys
import numpy
from layerforge.kernels import compile_lock, relu
compile_lock.WAIT_SECONDS = float(sys.argv[2])
dispatcher = relu._sum_relu.dispatcher()
a = numpy.ones(4, numpy.float32)

def compile():
    relu._sum_relu(a, a, 0.0, numpy.empty_like(a))

if sys.argv[1] == "hold":
    with compile_lock.compiling(compile_lock.lock_path(dispatcher.py_func)):
        print("holding", flush=True)
        sys.stdin.readline()
        compile()
else:
    compile()
print(json.dumps({"hits": sum(dispatcher.stats.cache_hits.values()),
                  "misses": sum(dispatcher.stats.cache_misses.values())}), flush=True)
"""


def start(tmp_path, role, wait_seconds):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", CHILD, role, str(wait_seconds)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def counts(proc):
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])


def test_a_process_waits_for_anothers_compile_and_loads_it(tmp_path):
    holder = start(tmp_path, "hold", 60)
    assert holder.stdout.readline() == "holding\n"
    waiter = start(tmp_path, "compile", 60)
    time.sleep(3.0)  # far longer than the waiter takes to start and compile the loop alone
    assert waiter.poll() is None, waiter.communicate()
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert counts(holder) == {"hits": 0, "misses": 1}
    assert counts(waiter) == {"hits": 1, "misses": 0}


def test_a_lock_held_past_the_wait_is_done_without(tmp_path):
    holder = start(tmp_path, "hold", 60)
    try:
        assert holder.stdout.readline() == "holding\n"
        started = time.monotonic()
        waiter = start(tmp_path, "compile", 0.5)
        assert counts(waiter) == {"hits": 0, "misses": 1}
        assert time.monotonic() - started < 60
    finally:
        holder.kill()
        holder.communicate()


@pytest.mark.parametrize("module", ["_product_jit", "_thin_jit", "_bf16_jit"])
def test_the_compiled_modules_compile_under_the_lock(module):
    """Every dispatcher of the kernel modules goes through compile_lock (numba's own decorators would not lock)."""
    import importlib

    from numba.core.dispatcher import Dispatcher

    loaded = importlib.import_module(f"layerforge.kernels.{module}")
    dispatchers = [v for v in vars(loaded).values() if isinstance(v, Dispatcher)]
    assert dispatchers
    for dispatcher in dispatchers:
        assert "compile" in vars(dispatcher), dispatcher.py_func.__qualname__
    assert compile_lock.lock_path(dispatchers[0].py_func).endswith(".lock")


def test_the_kernels_follow_the_features_numba_is_told_to_compile_for():
    """``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx,+avx2,+fma`` on any CPU: thin_gemm's chains in vectors of 8,
    and no bfloat16 kernel (its instruction is AVX512_BF16's), whatever /proc/cpuinfo lists."""
    script = ("from layerforge.kernels import _thin_jit, bf16_gemm, compile_lock\n"
              "print(sorted(compile_lock.target_features()), _thin_jit.LANES, bf16_gemm.available())")
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="+avx,+avx2,+fma", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['avx',", "'avx2',", "'fma']", "8", "False"]


# a process that compiles relu's _sum_relu on two kernel threads within errors.interrupting (as a command does),
# the main thread first (about 290 takes of numba's compiler lock, on a cold cache, and thousands of llvmlite's),
# numba's lock (or with "llvm", llvmlite's) patched to signal the process (SIGINT) just after its FIRE-th take on the
# main thread: the Interrupted comes where the __enter__ has the lock and its block has not begun. Prints how the
# compile ended and whether another thread can then take both locks
INTERRUPTED_COMPILE = """
import os, signal, sys, threading, time
import numpy
from numba.core import compiler_lock
from layerforge.errors import Interrupted, interrupting
from layerforge.kernels import compile_lock, relu, threadpool

from llvmlite.binding import ffi

fire, takes = int(sys.argv[1]), []
compile_lock.WAIT_SECONDS = 60.0
patched = ffi._LLVMLock if sys.argv[3:] == ["llvm"] else compiler_lock._CompilerLock
original = patched.__enter__

def enter(self):
    original(self)
    if threading.current_thread() is threading.main_thread():
        takes.append(1)
        if len(takes) == fire:
            os.kill(os.getpid(), signal.SIGINT)
patched.__enter__ = enter

threadpool.set_num_threads(2)
a = numpy.ones(1 << 20, numpy.float32)
out = numpy.empty_like(a)

def body(lo, hi):
    if threading.current_thread() is not threading.main_thread():
        time.sleep(0.2)  # the main thread compiles, the kernel thread asks for the kernel meanwhile
    relu._sum_relu(a[lo:hi], a[lo:hi], 0.0, out[lo:hi])

if sys.argv[2] == "wait":  # another process holds the function's compile: wait for it, signalled meanwhile
    threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    print("waiting", flush=True)
started = time.monotonic()
try:
    with interrupting():
        threadpool.parallel_for(len(a), body, work=len(a))
    print("compiled")
except Interrupted as e:
    free = []

    def take():
        for lock in (compiler_lock.global_compiler_lock._lock, ffi.lib._lock._lock):
            free.append(lock.acquire(timeout=10))
            if free[-1]:
                lock.release()
    taker = threading.Thread(target=take)
    taker.start()
    taker.join()
    print(f"interrupted by {e} after {time.monotonic() - started:.1f} s; the locks free to another thread: {free}")
"""


@pytest.mark.parametrize("lock, fire", [("numba", 1), ("numba", 3), ("numba", 40), ("numba", 250), ("llvm", 5),
                                        ("llvm", 500)])
def test_a_signal_as_numba_or_llvmlite_takes_its_lock_ends_the_compile_and_frees_the_locks(tmp_path, lock, fire):
    """Before, the Interrupted left the lock held: the kernel thread compiling next waited for it for ever, and the
    interrupted thread (or the command's exit) waited for that one (``layerforge train`` silent after a Ctrl-C in
    AUTO's first timing)."""
    out = run_python(INTERRUPTED_COMPILE, fire, "alone", lock, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    assert "interrupted by SIGINT" in out and out.strip().endswith("free to another thread: [True, True]"), out


def test_a_lock_of_llvmlite_a_signal_left_held_outside_a_compile_is_let_go_as_the_command_ends():
    """llvmlite takes its lock on every call into LLVM, a disposal of its objects by the garbage collector too."""
    import signal
    import threading

    from llvmlite.binding import ffi

    from layerforge.errors import Interrupted, interrupting
    with pytest.raises(Interrupted):
        with interrupting():
            ffi.lib._lock.__enter__()  # as a signal cut short after the acquire: never left
            signal.raise_signal(signal.SIGINT)
    free = []

    def take():
        free.append(ffi.lib._lock._lock.acquire(timeout=5))
        if free[0]:
            ffi.lib._lock._lock.release()
    taker = threading.Thread(target=take)
    taker.start()
    taker.join()
    assert free == [True]


def test_a_signal_while_waiting_for_another_process_s_compile_ends_it_at_once(tmp_path):
    holder = start(tmp_path, "hold", 60)
    try:
        assert holder.stdout.readline() == "holding\n"
        out = run_python(INTERRUPTED_COMPILE, 0, "wait", NUMBA_CACHE_DIR=str(tmp_path / "numba"))
        took = float(re.search(r"after ([\d.]+) s", out).group(1))
        assert 2.0 <= took < 30.0, out  # signalled 2 s in; the lock would have been waited for 60 s
        assert out.strip().endswith("free to another thread: [True, True]"), out
    finally:
        holder.kill()
        holder.communicate()
