"""A bfloat16 GEMM for CPUs with AVX512_BF16: ``gemm_precision: BF16``'s products on numpy arrays, at up to twice
the float32 rate, where the CPU has the instruction (:func:`available`).

``c = bf16(a) @ bf16(b)``: the operands rounded to bfloat16 (nearest, ties to even: blas.round_to_bfloat16's
rounding), every product exact in float32 and the sums accumulated in float32, as the emulated path of
kernels/blas.py computes them (that path rounds the operands and runs OpenBLAS's float32 GEMM); only the order of
the sums differs, and VDPBF16PS treats denormal operands and results as zero. numpy's and SciPy's OpenBLAS builds
ship no ``sbgemm`` (they are built without BUILD_BFLOAT16), so the kernel is compiled here: numba loops that pack
the operands into bfloat16 panels, and a 12 x 32 micro-kernel written in LLVM IR around the
``llvm.x86.avx512bf16.dpbf16ps.512`` intrinsic (a numba intrinsic, inlined into the loops).

The layout is GotoBLAS's: a block of ``KC`` k values at a time; B's block packed in panels of ``NR`` = 32 columns
(each k pair of a column interleaved, ``(panels, KC / 2, 32)`` words of two bfloat16, the layout VDPBF16PS multiplies), A's block in
panels of ``MR`` = 12 rows (``(panels, KC / 2, 12)`` words), one ``MC``-row block of A at a time (in the L2 cache); the
micro-kernel holds a 12 x 32 tile of c in 24 zmm registers and adds one broadcast k pair of A times a k pair of B
per instruction. The columns are split over the kernel threads (kernels.threadpool); each thread packs its own
panels, so the result is the same for any thread count.
"""
import functools
import os
import threading

import numpy

from .threadpool import num_threads, parallel_for



@functools.lru_cache(maxsize=None)
def available():
    """Whether this CPU has AVX512_BF16 (Linux: /proc/cpuinfo) and numba can compile the kernel; the environment
    variable ``LAYERFORGE_BF16_KERNEL=0`` turns the kernel off (gemm_precision BF16 then emulates it)."""
    if os.environ.get("LAYERFORGE_BF16_KERNEL", "1").strip().lower() in ("0", "false", "off"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    if "avx512_bf16" not in flags:
        return False
    from .compile_lock import target_features
    if "avx512bf16" not in target_features():  # numba told to compile for a CPU without it (NUMBA_CPU_FEATURES)
        return False
    try:
        _kernels()
    except Exception:  # noqa: BLE001 - numba or LLVM cannot build it: the emulated path stays
        return False
    return True


_lock = threading.Lock()


def _kernels():
    """kernels/_bf16_jit.py, the compiled loops and their block sizes (imported and compiled, or loaded from numba's
    cache, at the first call)."""
    with _lock:
        from . import _bf16_jit
    return _bf16_jit


def _by_columns(x):
    """Whether the 2-D ``x`` is read faster through its transpose (its columns contiguous, its rows not)."""
    return x.strides[0] == x.itemsize and x.strides[1] != x.itemsize


def _matmul_2d(a, b, out, accumulate):
    jit = _kernels()
    mr, nr, kc, mc = jit.MR, jit.NR, jit.KC, jit.MC  # the tile and block sizes
    m, k = a.shape
    n = b.shape[1]
    a_by_columns, b_by_columns = _by_columns(a), _by_columns(b)
    au = (a.T if a_by_columns else a).view(numpy.uint32)
    bt = b.T if b_by_columns else b
    pairs = (min(kc, k) + 1) // 2

    def columns(lo, hi):  # column panels [lo, hi) of c, with this thread's own packed panels
        n0, n1 = lo * nr, min(n, hi * nr)
        target = out[:, n0:n1]
        contiguous = target if target.flags.c_contiguous else (numpy.ascontiguousarray(target) if accumulate else
                                                                  numpy.empty(target.shape, numpy.float32))
        a_panels = numpy.empty((-(-min(mc, m) // mr), pairs, mr), numpy.uint32)  # words of two bfloat16
        b_panels = numpy.empty((hi - lo, pairs, nr), numpy.uint32)
        bu = (bt[n0:n1] if b_by_columns else bt[:, n0:n1]).view(numpy.uint32)
        jit.gemm(au, bu, a_by_columns, b_by_columns, contiguous, accumulate, a_panels, b_panels,
                 numpy.empty((mr, nr), numpy.float32))
        if contiguous is not target:
            target[...] = contiguous
    # two threads pay off from a few panels each; every thread packs A again
    parallel_for(-(-n // nr), columns, work=m * n if num_threads() > 1 and n >= 4 * nr else 0)
    return out


def matmul(a, b, out=None, accumulate=False):
    """``bf16(a) @ bf16(b)`` accumulated in float32 (module docstring) for float32 numpy arrays, numpy's matmul
    rules ((..., m, k) @ (..., k, n), batch axes broadcast; 1-D operands are not taken); into ``out`` when given,
    added to what ``out`` holds with ``accumulate``. Needs :func:`available`."""
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError("bf16_gemm.matmul takes operands of two or more axes")
    batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    shape = batch + (a.shape[-2], b.shape[-1])
    if out is None:
        out = numpy.empty(shape, numpy.float32)
    a, b = numpy.broadcast_to(a, batch + a.shape[-2:]), numpy.broadcast_to(b, batch + b.shape[-2:])
    for index in numpy.ndindex(*batch):
        _matmul_2d(a[index], b[index], out[index], accumulate)
    return out
