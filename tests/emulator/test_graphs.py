"""CUDA graph capture on the emulated device: recording, replay, and what capture refuses."""
import gc

import numpy
import pytest

from layerforge_emulator import runtime
from layerforge.solvers.cuda_graph import cuda_recorder
from tests.emulator.emulated import cupy  # noqa: F401 - the fixture


def test_capture_records_and_replay_reruns_on_the_same_buffers(cupy):
    x, y = cupy.ones(4, numpy.float32), cupy.zeros(4, numpy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    s.wait_event(cupy.cuda.Stream.null.record())  # x, y were written on the legacy stream
    with s:
        s.begin_capture()
        assert s.is_capturing()
        cupy.multiply(x, 3, out=y)
        y += 1
        graph = s.end_capture()
    assert (y.get() == 0).all()  # recorded, not run
    graph.launch(s)
    s.synchronize()
    assert (y.get() == 4).all()
    x[...] = 2
    s.wait_event(cupy.cuda.Stream.null.record())
    graph.launch(s)
    graph.launch(s)
    s.synchronize()
    assert (y.get() == 7).all()


@pytest.mark.parametrize("sync", [lambda cp, s, a: s.synchronize(), lambda cp, s, a: cp.cuda.Device().synchronize()])
def test_a_host_synchronisation_in_capture_raises_cudas_error(cupy, sync):
    s = cupy.cuda.Stream(non_blocking=True)
    a = cupy.ones(3)
    with s:
        s.begin_capture()
        with pytest.raises(runtime.CUDARuntimeError,
                           match="cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing"):
            sync(cupy, s, a)
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
            a * 2  # the capture is invalid from then on
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
            s.end_capture()
    assert not s.is_capturing()


@pytest.mark.parametrize("read", [lambda a: a.get(), lambda a: float(a[0]), lambda a: a[a > 0],
                                  lambda a: a.set(numpy.ones(3))])
def test_a_transfer_in_capture_raises_cupys_error(cupy, read):
    s = cupy.cuda.Stream(non_blocking=True)
    a = cupy.ones(3)
    with s:
        s.begin_capture()
        with pytest.raises(RuntimeError, match="the current stream is capturing, so (D2H|H2D) transfers are disallowed"):
            read(a)
        s.end_capture()  # cupy refused before CUDA saw it: the capture is still valid


def test_capture_is_refused_on_the_legacy_stream_and_beside_a_blocking_capture(cupy):
    with pytest.raises(RuntimeError, match="cannot capture on the default"):
        cupy.cuda.Stream.null.begin_capture()
    s = cupy.cuda.Stream()  # blocking: the legacy stream would depend on it
    s.begin_capture()
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureImplicit"):
        cupy.ones(3)
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
        s.end_capture()


def test_allocation_in_relaxed_capture_grows_the_pool(cupy):
    pool = cupy.cuda.MemoryPool()
    s = cupy.cuda.Stream(non_blocking=True)
    x = cupy.ones(5, numpy.float32)
    out = cupy.empty(5, numpy.float32)
    s.wait_event(cupy.cuda.Stream.null.record())  # x were written on the legacy stream
    with s, cupy.cuda.using_allocator(pool.malloc):
        s.begin_capture()  # cupy's default mode: relaxed
        tmp = x * 2  # a fresh cudaMalloc in the private pool: allowed
        cupy.add(tmp, 1, out=out)
        graph = s.end_capture()
    assert pool.total_bytes() == 20
    graph.launch(s)
    s.synchronize()
    assert (out.get() == 3).all()


def test_allocation_refused_in_global_mode_and_free_refused_in_any(cupy):
    s = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.MemoryPool()
    with s, cupy.cuda.using_allocator(pool.malloc):
        s.begin_capture(cupy.cuda.runtime.streamCaptureModeGlobal)
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureUnsupported"):
            cupy.empty(8)
        with pytest.raises(runtime.CUDARuntimeError):
            s.end_capture()
        warm = cupy.empty(8)
        del warm
        gc.collect()
        s.begin_capture()
        cupy.empty(8)  # the cached block: no CUDA call, allowed in every mode
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureUnsupported"):
            pool.free_all_blocks()  # cudaFree synchronises the device
        with pytest.raises(runtime.CUDARuntimeError):
            s.end_capture()


def test_replay_after_the_memory_went_back_to_the_device_is_an_illegal_address(cupy):
    pool = cupy.cuda.MemoryPool()
    s = cupy.cuda.Stream(non_blocking=True)
    x = cupy.ones(5, numpy.float32)
    with s, cupy.cuda.using_allocator(pool.malloc):
        s.begin_capture()
        tmp = x * 2
        tmp += 1
        graph = s.end_capture()
    del tmp
    gc.collect()
    pool.free_all_blocks()
    graph.launch(s)
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorIllegalAddress"):
        s.synchronize()


def test_layerforges_recorder_records_and_replays(cupy):
    s = cupy.cuda.Stream(non_blocking=True)
    w, y = cupy.full((3,), 2.0, numpy.float32), cupy.zeros(3, numpy.float32)
    s.wait_event(cupy.cuda.Stream.null.record())  # w, y were written on the legacy stream
    with s:
        replay = cuda_recorder(cupy)(lambda: cupy.multiply(w * w, 0.5, out=y))
        w[...] = 4
        replay()
        s.synchronize()
    assert (y.get() == 8).all()
