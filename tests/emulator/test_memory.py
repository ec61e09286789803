"""Device memory of the emulated device: exact sizes, the address registry, cupy's pool, OOM, pinned memory."""
import gc

import numpy
import pytest

from layerforge_emulator import allocations, memory, runtime
from tests.emulator.emulated import cupy  # noqa: F401 - the fixture


def test_allocations_are_exact_and_resolvable(cupy):
    a = cupy.empty(7, numpy.uint8)
    alloc = allocations.lookup(a.data.ptr, 7)
    assert alloc.size == 7 and alloc.ptr == a.data.ptr and alloc.ptr % 256 == 0
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorIllegalAddress"):
        allocations.lookup(a.data.ptr, 8)  # one byte past the end: no rounding hides it
    with pytest.raises(runtime.CUDARuntimeError, match="an illegal memory access was encountered"):
        allocations.lookup(12345, 1)


def test_the_pool_counts_caches_and_reuses_blocks(cupy):
    pool = cupy.get_default_memory_pool()
    used = pool.used_bytes()
    a = cupy.empty(1000, numpy.float32)
    assert pool.used_bytes() == used + 4000
    ptr = a.data.ptr
    a[...] = 1
    del a
    gc.collect()
    assert pool.used_bytes() == used and pool.free_bytes() >= 4000
    b = cupy.empty(1000, numpy.float32)  # the same size on the same stream: the cached block
    assert b.data.ptr == ptr and numpy.isnan(b.get()).all()  # poisoned again, not last user's ones
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    del b
    gc.collect()
    pool.free_all_blocks()
    assert cupy.cuda.runtime.memGetInfo()[0] >= free_before + 4000


def test_out_of_memory_is_cupys_error(cupy, monkeypatch):
    cupy.get_default_memory_pool().free_all_blocks()
    in_use = runtime.CONFIG.load().memory - cupy.cuda.runtime.memGetInfo()[0]
    monkeypatch.setattr(runtime.CONFIG, "memory", in_use + (1 << 20))
    keep = cupy.empty(1 << 19, numpy.uint8)
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError, match=r"Out of memory allocating 1,048,576 bytes "
                                                                   r"\(allocated so far: [\d,]+ bytes\)\."):
        cupy.empty(1 << 20, numpy.uint8)
    assert isinstance(keep, cupy.ndarray)


def test_a_pool_limit_is_cupys_error(cupy):
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        pool.set_limit(size=4096)
        held = cupy.empty(1024, numpy.float32)
        with pytest.raises(memory.OutOfMemoryError, match="limit set to: 4,096 bytes"):
            cupy.empty(1, numpy.float32)
        del held
        cupy.empty(1, numpy.float32)  # the pool releases its cached block to stay within the limit
    assert pool.get_limit() == 4096 and pool.used_bytes() == 0


def test_using_allocator_routes_allocations_to_a_private_pool(cupy):
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        a = cupy.zeros(10, numpy.float64)
        assert pool.used_bytes() == 80
    b = cupy.zeros(10, numpy.float64)
    assert pool.used_bytes() == 80 and b.data.ptr != a.data.ptr


def test_pinned_memory_and_host_register(cupy):
    import cupyx

    pinned = cupyx.empty_pinned((4,), numpy.float32)
    assert memory.is_pinned(pinned.ctypes.data, pinned.nbytes)
    buf = numpy.zeros(16, numpy.uint8)
    cupy.cuda.runtime.hostRegister(buf.ctypes.data, buf.nbytes, 0)
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorHostMemoryAlreadyRegistered"):
        cupy.cuda.runtime.hostRegister(buf.ctypes.data, 4, 0)
    cupy.cuda.runtime.hostUnregister(buf.ctypes.data)
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorHostMemoryNotRegistered"):
        cupy.cuda.runtime.hostUnregister(buf.ctypes.data)


def test_devices_and_their_properties(cupy):
    assert cupy.cuda.runtime.getDeviceCount() == 2
    props = cupy.cuda.runtime.getDeviceProperties(1)
    assert props["totalGlobalMem"] == runtime.CONFIG.memory and props["maxThreadsPerBlock"] == 1024
    assert cupy.cuda.Device(1).compute_capability == "90" and cupy.cuda.runtime.runtimeGetVersion() == 13000
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorInvalidDevice: invalid device ordinal"):
        cupy.cuda.Device(2).use()
    with cupy.cuda.Device(1):
        assert cupy.cuda.Device().id == 1 and cupy.zeros(1).device.id == 1
    assert cupy.cuda.Device().id == 0
