"""CUDA kernels behind the kernel entry points: ``.cu`` sources compiled on first use by cupy.

Every ``.cu`` file in this folder is plain CUDA C++ written against one element type ``T``
(``typedef LF_REAL T;``, with ``LF_REAL`` defined as ``float`` or ``double``) and ``extern "C"`` entry
points, so the same text compiles under NVRTC (cupy ``RawModule``, ``-DLF_REAL=float``) and under ``nvcc`` (tests/kernels/test_cuda_compile.py,
with the same defines). :func:`get_function` memoises one compiled module per (source, dtype); cupy is
imported inside it, so importing layerforge never needs cupy.

Kernels use grid-stride loops over a flat element count (Caffe's ``CUDA_KERNEL_LOOP``): :func:`launch`
picks the launch shape from the count alone.

Precision of the cuBLAS GEMMs (every ``xp.matmul`` on cupy arrays) is one process-wide switch,
:func:`set_gpu_math`, or env ``LAYERFORGE_TF32=1`` (applied when a solver or net selects the GPU, and at the
first kernel compilation): strict fp32 by default, TF32 tensor
cores when asked. See docs/gpu.md.
"""
import functools
import math
import os
from pathlib import Path

import numpy

HERE = Path(__file__).resolve().parent
CTYPES = {numpy.dtype(numpy.float32): "float", numpy.dtype(numpy.float64): "double"}
BLOCK = 256  # threads per block for the element-wise (grid-stride) kernels
MAX_BLOCKS = 65535 * 4
NVRTC_OPTIONS = ("-std=c++17",)


def sources():
    """Every ``.cu`` source of this package, by stem: ``{"im2col": Path, ...}``."""
    return {p.stem: p for p in sorted(HERE.glob("*.cu"))}


def defines(dtype):
    """The preprocessor options that instantiate a source for ``dtype`` (float32 or float64)."""
    return (f"-DLF_REAL={CTYPES[numpy.dtype(dtype)]}",)


@functools.lru_cache(maxsize=None)
def _module(stem, dtype_str):
    import cupy

    apply_gpu_math_env()
    code = sources()[stem].read_text()
    return cupy.RawModule(code=code, options=NVRTC_OPTIONS + defines(dtype_str))


def get_function(stem, name, dtype):
    """The compiled kernel ``name`` of ``<stem>.cu`` for ``dtype`` (compiled once per process and dtype)."""
    return _module(stem, numpy.dtype(dtype).str).get_function(name)


def blocks(n, block=BLOCK):
    """Grid size for a grid-stride loop over ``n`` elements."""
    return max(1, min(MAX_BLOCKS, math.ceil(n / block)))


def kernel_args(args):
    """``args`` with every Python int as a C ``int`` (numpy.int32).

    cupy passes a Python int as ``long long`` and a Python float as ``double``; these kernels declare
    ``int`` counts and sizes, and ``T`` scalars, which callers pass already converted (:func:`scalar`).
    """
    out = []
    for a in args:
        if type(a) in (bool, float):  # exact types: numpy.float64 subclasses float and is already typed
            raise TypeError(f"kernel argument {a!r}: pass numpy scalars of the kernel's type")
        if type(a) is int:
            if not -2 ** 31 <= a < 2 ** 31:
                raise OverflowError(f"kernel argument {a} does not fit a C int")
            a = numpy.int32(a)
        out.append(a)
    return tuple(out)


def run(stem, name, dtype, grid, block, args, shared_mem=0):
    """Launch kernel ``name`` of ``<stem>.cu`` for ``dtype`` on an explicit ``grid`` and ``block``."""
    get_function(stem, name, dtype)(tuple(grid), tuple(block), kernel_args(args), shared_mem=shared_mem)


def launch(stem, name, dtype, n, args, shared_mem=0):
    """Run kernel ``name`` of ``<stem>.cu`` over ``n`` elements (a grid-stride loop of :data:`BLOCK` threads)."""
    if n == 0:
        return
    run(stem, name, dtype, (blocks(n),), (BLOCK,), args, shared_mem)


def scalar(dtype, value):
    """``value`` as a ``dtype`` scalar, the form a kernel's ``T`` parameter needs."""
    return numpy.dtype(dtype).type(value)


# --- precision of the cuBLAS GEMMs ------------------------------------------------------------------
_GPU_MATH = {"tf32": None}


def set_gpu_math(tf32=False):
    """Let cuBLAS use TF32 tensor cores for float32 GEMMs (``tf32=True``) or keep strict fp32 (default).

    Applies to every later ``cupy.matmul`` in this process; float64 is unaffected.
    """
    from cupy._core import _routines_linalg as linalg

    mode = linalg.COMPUTE_TYPE_TF32 if tf32 else linalg.COMPUTE_TYPE_PEDANTIC
    linalg.set_compute_type(numpy.float32, mode)
    _GPU_MATH["tf32"] = bool(tf32)


def apply_gpu_math_env():
    if _GPU_MATH["tf32"] is None:
        set_gpu_math(os.environ.get("LAYERFORGE_TF32", "0") not in ("", "0", "false", "False"))
