"""The switch: the emulated device takes the place of cupy in ``sys.modules``.

:func:`install` puts an import hook first on ``sys.meta_path``: ``import cupy`` (and its submodules) then
loads the emulator's modules, so a CPU run still never imports cupy, while every GPU entry point (``--gpu N``,
``solver_mode: GPU``, ``--devices``, ``Net(..., xp=cupy)``, ``caffe.set_mode_gpu()``) gets the emulator. It wins
over an installed cupy: the real modules are taken out of ``sys.modules``. ``LAYERFORGE_EMULATED_GPU=1`` (any
value but empty or ``0``) makes ``import layerforge`` call :func:`install` (layerforge/emulated_gpu.py, its only
import of this package), in every subprocess that inherits the variable too (``mpiexec`` ranks, CGDP workers).
Tests that want it without the variable use :func:`installed` (a context manager that puts the previous
modules back afterwards).

Modules put in place (what layerforge, its tests and benchmarks import): ``cupy``, ``cupy.cuda`` and its
``runtime``, ``memory``, ``device``, ``stream``, ``graph``, ``nccl``, ``nvtx``; ``cupy.random``; ``cupyx``;
``cupy_backends.cuda.api.runtime`` and ``cupy_backends.cuda.libs.cublas`` / ``nccl``.
"""
import contextlib
import importlib
import importlib.util
import sys
import threading
import types

from . import planted

ENV = "LAYERFORGE_EMULATED_GPU"  # the variable layerforge reads to call install() (layerforge/emulated_gpu.py)
VERSION = "14.0.0+layerforge.emulator"
PREFIXES = ("cupy", "cupyx", "cupy_backends")
_state = {"modules": None}


def _module(name, doc, attributes, package=False):
    module = types.ModuleType(name, doc)
    module.__dict__.update(attributes)
    module.__file__ = __file__
    if package:
        module.__path__ = []
    return module


class _Nvtx:
    """``cupy.cuda.nvtx``: ranges pushed and popped per thread; popping more than was pushed is an error here
    (NVTX ignores it)."""

    available = True
    _local = threading.local()

    @classmethod
    def RangePush(cls, message, id_color=-1):
        cls._local.__dict__.setdefault("stack", []).append(message)

    @classmethod
    def RangePushC(cls, message, color=0):
        cls.RangePush(message)

    @classmethod
    def RangePop(cls):
        stack = cls._local.__dict__.get("stack")
        if not stack:
            raise RuntimeError("nvtx.RangePop() without a matching RangePush()")
        stack.pop()

    @classmethod
    def Mark(cls, message, id_color=-1):
        """A point in the timeline: nothing to record on the emulated device."""

    @classmethod
    def depth(cls):
        return len(cls._local.__dict__.get("stack", []))


def _build():
    """Every stand-in module, by name."""
    from . import allocations, cublas, device, functions, graphs, memory, nccl, random, raw, runtime, streams
    from .arrays import ndarray

    mods = {}
    runtime_names = {name: getattr(runtime, name) for name in (
        "CUDARuntimeError", "getDeviceCount", "getDevice", "setDevice", "getDeviceProperties", "runtimeGetVersion",
        "driverGetVersion")}
    runtime_names.update(deviceSynchronize=streams.deviceSynchronize, memGetInfo=allocations.memGetInfo,
                         hostRegister=memory.hostRegister, hostUnregister=memory.hostUnregister,
                         streamIsCapturing=_stream_is_capturing,
                         streamCaptureModeGlobal=graphs.streamCaptureModeGlobal,
                         streamCaptureModeThreadLocal=graphs.streamCaptureModeThreadLocal,
                         streamCaptureModeRelaxed=graphs.streamCaptureModeRelaxed, is_hip=False)
    mods["cupy_backends.cuda.api.runtime"] = _module("cupy_backends.cuda.api.runtime", runtime.__doc__,
                                                     runtime_names)
    mods["cupy.cuda.runtime"] = mods["cupy_backends.cuda.api.runtime"]
    cublas_names = {n: getattr(cublas, n) for n in dir(cublas) if n.startswith("CUBLAS_")}
    cublas_names.update({n: getattr(cublas, n) for n in (
        "create", "destroy", "setStream", "getStream", "setPointerMode", "getPointerMode", "setMathMode",
        "getMathMode", "gemmStridedBatchedEx")})
    cublas_names["CUBLASError"] = cublas.CUBLASError
    mods["cupy_backends.cuda.libs.cublas"] = _module("cupy_backends.cuda.libs.cublas", cublas.__doc__, cublas_names)
    nccl_names = {n: getattr(nccl, n) for n in dir(nccl) if n.startswith("NCCL_") and n != "NCCL_UNIQUE_ID_BYTES" or n in (
        "available", "get_unique_id", "get_version", "get_build_version", "groupStart", "groupEnd",
        "NcclCommunicator", "NcclError")}
    mods["cupy_backends.cuda.libs.nccl"] = _module("cupy_backends.cuda.libs.nccl", nccl.__doc__, nccl_names)
    mods["cupy.cuda.nccl"] = _module("cupy.cuda.nccl", nccl.__doc__, nccl_names)
    mods["cupy_backends.cuda.libs"] = _module("cupy_backends.cuda.libs", None, {
        "cublas": mods["cupy_backends.cuda.libs.cublas"], "nccl": mods["cupy_backends.cuda.libs.nccl"]}, True)
    mods["cupy_backends.cuda.api"] = _module("cupy_backends.cuda.api", None,
                                             {"runtime": mods["cupy_backends.cuda.api.runtime"]}, True)
    mods["cupy_backends.cuda"] = _module("cupy_backends.cuda", None, {"api": mods["cupy_backends.cuda.api"],
                                                                      "libs": mods["cupy_backends.cuda.libs"]}, True)
    mods["cupy_backends"] = _module("cupy_backends", None, {"cuda": mods["cupy_backends.cuda"]}, True)

    memory_names = {n: getattr(memory, n) for n in (
        "OutOfMemoryError", "MemoryPool", "MemoryPointer", "alloc", "set_allocator", "get_allocator")}
    mods["cupy.cuda.memory"] = _module("cupy.cuda.memory", memory.__doc__, memory_names)
    mods["cupy.cuda.device"] = _module("cupy.cuda.device", device.__doc__, dict(
        Device=device.Device, get_device_id=device.get_device_id, get_compute_capability=device.get_compute_capability,
        get_cublas_handle=cublas.get_cublas_handle))
    stream_names = {n: getattr(streams, n) for n in ("Stream", "Event", "get_current_stream", "get_elapsed_time")}
    mods["cupy.cuda.stream"] = _module("cupy.cuda.stream", streams.__doc__, stream_names)
    mods["cupy.cuda.graph"] = _module("cupy.cuda.graph", graphs.__doc__, {"Graph": streams.Graph})
    mods["cupy.cuda.nvtx"] = _module("cupy.cuda.nvtx", _Nvtx.__doc__, {
        n: getattr(_Nvtx, n) for n in ("available", "RangePush", "RangePushC", "RangePop", "Mark")})
    cuda_names = dict(stream_names, Device=device.Device, using_allocator=memory.using_allocator,
                      MemoryPool=memory.MemoryPool, MemoryPointer=memory.MemoryPointer, alloc=memory.alloc,
                      set_allocator=memory.set_allocator, get_allocator=memory.get_allocator, Graph=streams.Graph,
                      get_device_id=device.get_device_id, is_available=lambda: True,
                      get_cublas_handle=cublas.get_cublas_handle, runtime=mods["cupy.cuda.runtime"],
                      memory=mods["cupy.cuda.memory"], device=mods["cupy.cuda.device"],
                      stream=mods["cupy.cuda.stream"], graph=mods["cupy.cuda.graph"], nvtx=mods["cupy.cuda.nvtx"],
                      nccl=mods["cupy.cuda.nccl"])
    mods["cupy.cuda"] = _module("cupy.cuda", "The emulated CUDA device (layerforge_emulator).",
                                cuda_names, True)
    random_names = {n: getattr(random, n) for n in (
        "RandomState", "seed", "get_random_state", "standard_normal", "normal", "uniform", "random_sample", "random",
        "rand", "randn", "randint")}
    mods["cupy.random"] = _module("cupy.random", random.__doc__, random_names, True)
    mods["cupyx"] = _module("cupyx", None, {"empty_pinned": memory.empty_pinned, "zeros_pinned": memory.zeros_pinned},
                            True)
    names = {n: getattr(functions, n) for n in dir(functions)
             if not n.startswith("_") and n not in functions.INTERNAL and not isinstance(getattr(functions, n),
                                                                                          types.ModuleType)}
    names.update(ndarray=ndarray, cuda=mods["cupy.cuda"],
                 random=mods["cupy.random"], RawModule=raw.RawModule, RawKernel=raw.RawKernel,
                 get_default_memory_pool=memory.get_default_memory_pool, is_available=lambda: True,
                 get_array_module=_get_array_module, __version__=VERSION)
    mods["cupy"] = _module("cupy", "cupy on layerforge's emulated CUDA device (layerforge_emulator).",
                           names, True)
    return mods


def _stream_is_capturing(stream):
    """``cudaStreamIsCapturing`` of a raw stream handle."""
    from .streams import stream_from_ptr
    return stream_from_ptr(stream).is_capturing()


def _get_array_module(*args):
    """``cupy.get_array_module``: the emulated cupy for device arrays, else numpy."""
    import numpy

    from .arrays import ndarray
    return sys.modules["cupy"] if any(isinstance(a, ndarray) for a in args) else numpy


class _Finder:
    """The import hook: every ``cupy`` / ``cupyx`` / ``cupy_backends`` module comes from the emulator; a
    submodule it lacks is a ModuleNotFoundError (never the real package's)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] not in PREFIXES:
            return None
        module = _modules().get(name)
        return importlib.util.spec_from_loader(name, _Finder, is_package=hasattr(module, "__path__"))

    @staticmethod
    def create_module(spec):
        module = _modules().get(spec.name)
        if module is None:
            raise ModuleNotFoundError(f"No module named '{spec.name}' (not part of the emulated cupy)", name=spec.name)
        return module

    @staticmethod
    def exec_module(module):
        """Built already."""


def _modules():
    if _state["modules"] is None:
        _state["modules"] = _build()
    return _state["modules"]


def _ours():
    return {name: module for name, module in sys.modules.items() if name.split(".")[0] in PREFIXES}


def install():
    """Make ``import cupy`` load the emulator from now on (a real cupy already imported is dropped from
    ``sys.modules``). Nothing is imported until someone imports cupy."""
    if _Finder not in sys.meta_path:
        sys.meta_path.insert(0, _Finder)
    planted.install_if_requested()  # a test's planted removal of a stream wait (planted.py)
    for name, module in _ours().items():
        if module is not _modules().get(name):
            del sys.modules[name]


def is_installed():
    return _Finder in sys.meta_path


@contextlib.contextmanager
def _restoring():
    """The cupy modules and the import hook as they were before the block, after it."""
    before, hooked = _ours(), is_installed()
    try:
        yield
    finally:
        if hooked and not is_installed():
            sys.meta_path.insert(0, _Finder)
        if not hooked and is_installed():
            sys.meta_path.remove(_Finder)
        for name in _ours():
            del sys.modules[name]
        sys.modules.update(before)


@contextlib.contextmanager
def installed():
    """The emulated cupy for the block; the modules and the import hooks of before (none, or a real cupy) after."""
    with _restoring():
        install()
        yield importlib.import_module("cupy")


@contextlib.contextmanager
def uninstalled():
    """The world without the emulator for the block: no import hook, no emulated module in ``sys.modules``, so
    ``import cupy`` finds the installed cupy (or none); the emulator and its modules are back after. For tests
    of what happens where there is no device, in a process that has the emulator installed."""
    with _restoring():
        if is_installed():
            sys.meta_path.remove(_Finder)
        for name, module in _ours().items():
            if module is _modules().get(name):
                del sys.modules[name]
        yield
