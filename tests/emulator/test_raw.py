"""RawModule / RawKernel over the kernel executor's interface (a small stand-in executor here): arguments
converted as cupy's launcher does, launches ordered on the stream and recorded under capture."""
import ctypes
import sys
import types
from typing import NamedTuple

import numpy
import pytest

import layerforge_emulator as emulator_package
from layerforge_emulator import runtime
from tests.emulator.emulated import cupy  # noqa: F401 - the fixture

CODE = 'extern "C" __global__ void scale(float* x, float a, int n) { /* x[i] *= a */ }'


class DevicePointer(NamedTuple):
    address: int
    dtype: object
    base: int
    size: int


class FakeKernel:
    """Scales ``n`` floats at the pointer by ``a`` through the raw address, as compiled code would."""

    def __init__(self, name, launches):
        self.name, self.launches = name, launches

    def launch(self, grid, block, args, shared_mem=0):
        self.launches.append((grid, block, args, shared_mem))
        x, a, n = args
        if not x.address:
            return
        buf = (ctypes.c_float * int(n)).from_address(x.address)
        for i in range(int(n)):
            buf[i] *= float(a)


@pytest.fixture
def launches(monkeypatch):
    log, compiled = [], []

    def compile_module(code, options=(), name_expressions=(), sanitizer=None):
        compiled.append((code, options))
        return types.SimpleNamespace(function=lambda name: FakeKernel(name, log))

    fake = types.SimpleNamespace(DevicePointer=DevicePointer, compile_module=compile_module)
    monkeypatch.setitem(sys.modules, emulator_package.__name__ + ".kernel_runner", fake)
    monkeypatch.setattr(emulator_package, "kernel_runner", fake, raising=False)
    return log, compiled


def test_arguments_are_converted_as_cupys_launcher_does(cupy, launches):
    log, compiled = launches
    x = cupy.ones(8, numpy.float32)
    kernel = cupy.RawModule(code=CODE, options=("-DLF_REAL=float",)).get_function("scale")
    kernel((1,), (8,), (x, numpy.float32(3), numpy.int32(8)))
    assert compiled == [(CODE, ("-DLF_REAL=float",))] and (x.get() == 3).all()
    grid, block, args, shared = log[-1]
    assert grid == (1, 1, 1) and block == (8, 1, 1) and shared == 0
    assert args[0] == DevicePointer(x.data.ptr, numpy.dtype(numpy.float32), x.data.ptr, 32)
    kernel((1,), (8,), (x[2:], 2.0, 3))  # Python float -> double, int -> long long, pointer inside the allocation
    cupy.cuda.Stream.null.synchronize()  # the launch runs when something waits for it
    _, _, args, _ = log[-1]
    assert args[0].address == x.data.ptr + 8 and args[0].base == x.data.ptr and args[0].size == 32
    assert type(args[1]) is numpy.float64 and type(args[2]) is numpy.int64
    assert x.get().tolist() == [3, 3, 6, 6, 6, 3, 3, 3]
    kernel((1,), (1,), (None, numpy.array([2.0], numpy.float32), 2 ** 63))
    cupy.cuda.Stream.null.synchronize()
    _, _, args, _ = log[-1]
    assert args[0].address == 0 and type(args[1]) is numpy.float32 and type(args[2]) is numpy.uint64


def test_host_arrays_and_bad_shapes_are_refused(cupy, launches):
    kernel = cupy.RawKernel(CODE, "scale")
    with pytest.raises(TypeError, match="numpy.ndarray of shape \\(4,\\) as a kernel parameter"):
        kernel((1,), (4,), (numpy.ones(4, numpy.float32), 1.0, 4))
    with pytest.raises(TypeError, match="expected tuple"):
        kernel(1, (4,), (cupy.ones(4, numpy.float32), 1.0, 4))
    with pytest.raises(TypeError, match="Unsupported type"):
        kernel((1,), (4,), (cupy.ones(4, numpy.float32), "1", 4))


def test_launches_follow_the_stream_and_are_recorded_under_capture(cupy, launches):
    log, _ = launches
    kernel = cupy.RawKernel(CODE, "scale")
    x = cupy.ones(4, numpy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    kernel((1,), (4,), (x, numpy.float32(2), numpy.int32(4)), stream=s)
    assert (x.get() == 1).all() and not log  # queued on `s`
    s.synchronize()
    assert (x.get() == 2).all()
    with s:
        s.begin_capture()
        kernel((1,), (4,), (x, numpy.float32(5), numpy.int32(4)))
        graph = s.end_capture()
    graph.launch(s)
    graph.launch(s)
    s.synchronize()
    assert (x.get() == 50).all()


def test_a_launch_on_freed_memory_is_an_illegal_address(cupy, launches):
    kernel = cupy.RawKernel(CODE, "scale")
    pool = cupy.cuda.MemoryPool()
    s = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc):
        x = cupy.ones(4, numpy.float32)
    kernel((1,), (4,), (x, numpy.float32(2), numpy.int32(4)), stream=s)
    del x
    pool.free_all_blocks()  # waits for the device: the launch ran before the memory went back
    with cupy.cuda.using_allocator(pool.malloc):
        y = cupy.ones(4, numpy.float32)
    with s:
        s.begin_capture()
        kernel((1,), (4,), (y, numpy.float32(2), numpy.int32(4)))
        graph = s.end_capture()
    del y
    pool.free_all_blocks()
    graph.launch(s)
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorIllegalAddress"):
        s.synchronize()
