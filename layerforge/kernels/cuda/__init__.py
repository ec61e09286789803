"""CUDA kernels behind the kernel entry points: ``.cu`` sources compiled on first use by cupy.

Every ``.cu`` file in this folder is plain CUDA C++ written against one element type ``T``
(``typedef LF_REAL T;``, with ``LF_REAL`` defined as ``float`` or ``double``) and ``extern "C"`` entry
points, so the same text compiles under NVRTC (cupy ``RawModule``, ``-DLF_REAL=float``) and under ``nvcc`` (tests/kernels/test_cuda_compile.py,
with the same defines). :func:`get_function` memoises one compiled module per (source, dtype); cupy is
imported inside it, so importing layerforge never needs cupy.

Kernels use grid-stride loops over a flat element count (Caffe's ``CUDA_KERNEL_LOOP``): :func:`launch`
picks the launch shape from the count alone.

Matrix products do not live here: every GEMM goes through :mod:`layerforge.kernels.blas` (cuBLAS on a
GPU, with the process's precision switch; docs/gpu.md).
"""
import functools
import math
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
