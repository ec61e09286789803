"""``cupy.RawModule`` / ``cupy.RawKernel`` on the emulated device, over the kernel executor
(``kernel_runner.compile_module``: the same ``.cu`` text built with g++ against a small CUDA header).

A call ``kernel(grid, block, args, shared_mem=0, stream=None)`` converts ``args`` as cupy's launcher does
(cupy/cuda/function.pyx ``_pointer``):

- a device array: a pointer to its first element (``DevicePointer`` with its dtype, so the executor checks
  it against the kernel's parameter type); a ``MemoryPointer``: a raw pointer; None: a null pointer;
- a numpy array of one element: its value, by value in its dtype; of any other size: cupy's TypeError (a
  host array where a device pointer was meant);
- a Python ``int``: ``long long`` (``unsigned long long`` from 2**63), ``float``: ``double``, ``bool``:
  ``bool``, ``complex``: ``complex<double>``; a numpy scalar: its own type.

The launch is submitted to ``stream`` (the current one) like every device operation: it runs when the stream
runs it, or is recorded under capture; the pointers are checked again against the live allocations then.
"""
import numpy

from . import allocations, memory, streams
from .arrays import ndarray
from .runtime import getDevice


def _runner():
    from . import kernel_runner  # the executor, imported on the first kernel (it builds with g++)
    return kernel_runner


def _dims(dims, what):
    if not isinstance(dims, tuple):
        raise TypeError(f"Argument '{what}' has incorrect type (expected tuple, got {type(dims).__name__})")
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {dims}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def _pointer(address, dtype):
    """A ``DevicePointer`` to ``address`` (with the allocation it lies in; null for 0)."""
    DevicePointer = _runner().DevicePointer
    if not address:
        return DevicePointer(0, dtype, 0, 0)
    alloc = allocations.lookup(address, 1)
    return DevicePointer(int(address), dtype, alloc.ptr, alloc.size)


def convert_argument(x):
    """One kernel argument as the device sees it: a ``DevicePointer`` or a numpy scalar (cupy's rules)."""
    if x is None:
        return _pointer(0, None)
    if isinstance(x, ndarray):
        if x.data.device_id != getDevice():
            raise ValueError(f"The device where the array resides ({x.data.device_id}) is different from the "
                             f"current device ({getDevice()}). Peer access is unavailable between these devices.")
        return _pointer(x.data.ptr if x.size else 0, x.dtype)
    if isinstance(x, memory.MemoryPointer):
        return _pointer(x.ptr, None)
    if isinstance(x, numpy.ndarray):
        if x.size == 1:
            return x.reshape(-1)[0]
        raise TypeError(f"You are trying to pass a numpy.ndarray of shape {x.shape} as a kernel parameter. Only "
                        "numpy.ndarrays of size one can be passed by value. If you meant to pass a pointer to "
                        "__global__ memory, you need to pass a cupy.ndarray instead.")
    if type(x) is bool:
        return numpy.bool_(x)
    if type(x) is int:
        return numpy.uint64(x) if x >= 2 ** 63 else numpy.int64(x)
    if type(x) is float:
        return numpy.float64(x)
    if type(x) is complex:
        return numpy.complex128(x)
    if isinstance(x, numpy.generic):
        return x
    raise TypeError(f"Unsupported type {type(x)}")


class Function:
    """A compiled kernel (cupy's ``cupy.cuda.Function``): call it with ``(grid, block, args, shared_mem=0,
    stream=None)``."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.name = kernel.name

    def __call__(self, grid, block, args, shared_mem=0, stream=None, enable_cooperative_groups=False):
        grid, block = _dims(grid, "grid"), _dims(block, "block")
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"args must be a tuple or a list, got {type(args).__name__}")
        converted = tuple(convert_argument(a) for a in args)
        streams.submit(self._launch, grid, block, converted, int(shared_mem), name=f"kernel {self.name}",
                       stream=stream)

    def _launch(self, grid, block, args, shared_mem):
        for a in args:
            if isinstance(a, _runner().DevicePointer) and a.size:
                allocations.lookup(a.base, a.size)  # freed since the launch was queued: an illegal address
        self.kernel.launch(grid, block, args, shared_mem)


class RawModule:
    """``cupy.RawModule(code=... or path=..., options=(), name_expressions=None, ...)``: compiled on first use
    (``get_function`` or ``compile``), once per (code, options) in the process."""

    def __init__(self, *, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        if (code is None) == (path is None):
            raise TypeError("Exactly one of `code` and `path` keyword arguments must be given.")
        if path is not None:
            with open(path) as f:
                code = f.read()
        self.code, self.options = code, tuple(options)
        self.name_expressions = tuple(name_expressions or ())
        self.backend, self._module = backend, None

    @property
    def module(self):
        if self._module is None:
            self._module = _runner().compile_module(self.code, self.options, self.name_expressions)
        return self._module

    def compile(self, log_stream=None):
        return self.module

    def get_function(self, name):
        return Function(self.module.function(name))


class RawKernel:
    """``cupy.RawKernel(code, name, options=(), ...)``: one kernel of ``code``, called as :class:`Function`."""

    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False, *,
                 enable_cooperative_groups=False, jitify=False):
        self.code, self.name, self.options = code, name, tuple(options)
        self._module = RawModule(code=code, options=options)

    @property
    def kernel(self):
        return self._module.get_function(self.name)

    def compile(self, log_stream=None):
        self._module.compile()

    def __call__(self, grid, block, args, **kwargs):
        self.kernel(grid, block, args, **kwargs)
