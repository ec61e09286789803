"""Running layerforge's GPU launchers (layerforge/kernels/cuda/*.py) on the emulated kernel executor with numpy
buffers: ``numpy_as_cupy`` stands numpy in for the few cupy functions the launchers call (allocation and
layout) and puts :func:`kernel_runner.compile_module` behind ``cupy.RawModule``, so the launchers' own argument
lists reach the kernels. The cupy stand-in of the emulated device is not needed for that."""
import re
import sys
import types
from contextlib import contextmanager

import numpy

from layerforge.kernels import cuda
from layerforge_emulator import kernel_runner
from layerforge_emulator.kernel_runner import DevicePointer

DTYPES = [numpy.float32, numpy.float64]
TOL = {numpy.float64: 1e-10, numpy.float32: 1e-4}


def rand(shape, dtype, seed=0, low=-1.0, high=1.0):
    return numpy.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


def close(got, want, dtype):
    got, want = numpy.asarray(got), numpy.asarray(want)
    assert got.shape == want.shape
    scale = max(1.0, float(numpy.abs(want).max(initial=0)))
    numpy.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def device_args(args):
    """Launch arguments with numpy arrays as device pointers (what cupy passes for its arrays)."""
    return tuple(DevicePointer.of(a) if isinstance(a, numpy.ndarray) else a for a in args)


class RawKernel:
    """cupy's RawKernel call on an emulated kernel."""

    def __init__(self, function):
        self.function = function

    def __call__(self, grid, block, args, shared_mem=0):
        LAUNCHES.append((self.function.name, tuple(grid) + (1,) * (3 - len(tuple(grid)))))
        self.function.launch(grid, block, device_args(args), shared_mem)


LAUNCHES = []  # (kernel name, grid as 3 ints) of every launch through RawKernel, for the shape checks


class RawModule:
    """cupy's RawModule on the emulated kernel executor."""

    def __init__(self, code, options=(), name_expressions=()):
        self.module = kernel_runner.compile_module(code, options, name_expressions)

    def get_function(self, name):
        return RawKernel(self.module.function(name))


@contextmanager
def numpy_as_cupy():
    """``import cupy`` inside the block gives numpy with :class:`RawModule`: the GPU launchers (called
    directly) run on numpy buffers through the emulated kernels, while the dispatching entry points still
    take numpy arrays to their CPU bodies."""
    shim = types.ModuleType("cupy")
    shim.__dict__.update({k: getattr(numpy, k) for k in dir(numpy) if not k.startswith("__")})
    shim.RawModule = RawModule
    # no array is a cupy array: the entry points keep dispatching numpy arrays to their CPU bodies
    shim.ndarray = type("ndarray", (), {})
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = shim
    cuda._module.cache_clear()
    try:
        yield
    finally:
        cuda._module.cache_clear()
        if saved is None:
            del sys.modules["cupy"]
        else:
            sys.modules["cupy"] = saved


def module(stem, dtype, sanitizer=None):
    """The emulated build of layerforge's ``<stem>.cu`` for ``dtype``."""
    return kernel_runner.compile_module(cuda.sources()[stem].read_text(), cuda.NVRTC_OPTIONS + cuda.defines(dtype),
                                        sanitizer=sanitizer)


def launch(stem, name, dtype, grid, block, args, shared_mem=0, sanitizer=None, text=None):
    """One launch of a layerforge kernel (or of ``text``, an edited copy of its source) on numpy buffers, with
    Python ints as C ints as layerforge's launchers pass them."""
    if text is None:
        m = module(stem, dtype, sanitizer)
    else:
        m = kernel_runner.compile_module(text, cuda.NVRTC_OPTIONS + cuda.defines(dtype), sanitizer=sanitizer)
    m.function(name).launch(grid, block, device_args(cuda.kernel_args(args)), shared_mem)


def implicit_gemm_without_barrier(index):
    """implicit_gemm.cu with the tile loop's ``index``-th ``__syncthreads`` (0: after the loads, 1: after their
    use) removed: a planted race."""
    text = cuda.sources()["implicit_gemm"].read_text()
    barriers = list(re.finditer(r"^[ \t]*__syncthreads\(\);[^\n]*\n", text, re.M))  # found by what they are
    assert len(barriers) == 2, f"implicit_gemm.cu's tile loop has two barriers, found {len(barriers)}"
    gone = barriers[index]
    return text[:gone.start()] + text[gone.end():]
