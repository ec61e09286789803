"""Streams and events: the execution model makes a missing synchronisation show as stale data, and keeps
correctly ordered code correct."""
import numpy
import pytest

from layerforge_emulator import runtime
from tests.emulator.emulated import cupy  # noqa: F401 - the fixture


def test_work_on_a_stream_is_not_seen_before_it_is_ordered(cupy):
    a = cupy.ones(4, numpy.float32)
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        b = a * 2
    assert numpy.isnan(b.get()).all()  # the legacy stream did not wait for `side`: stale (poisoned) memory
    side.synchronize()
    assert (b.get() == 2).all()


def test_an_event_orders_two_streams(cupy):
    a = cupy.ones(4, numpy.float32)
    producer, consumer = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with producer:
        b = a + 1
        done = producer.record()
    consumer.wait_event(done)
    with consumer:
        c = b * 10
    consumer.synchronize()
    assert (c.get() == 20).all()


def test_without_the_event_the_consumer_reads_stale_data(cupy):
    a = cupy.ones(4, numpy.float32)
    producer, consumer = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with producer:
        b = a + 1
    with consumer:
        c = b * 10
    consumer.synchronize()
    producer.synchronize()
    assert numpy.isnan(c.get()).all() and (b.get() == 2).all()


def test_the_legacy_stream_waits_for_blocking_streams_only(cupy):
    a = cupy.ones(4, numpy.float32)
    blocking, non_blocking = cupy.cuda.Stream(), cupy.cuda.Stream(non_blocking=True)
    with blocking:
        b = a + 1
    with non_blocking:
        c = a + 2
    d, e = b * 1, c * 1  # on the legacy stream
    assert (d.get() == 2).all() and numpy.isnan(e.get()).all()
    assert not non_blocking.is_capturing() and non_blocking.done and (c.get() == 3).all()


def test_a_device_synchronize_runs_every_stream(cupy):
    a = cupy.ones(3)
    streams = [cupy.cuda.Stream() for _ in range(3)]  # blocking: they wait for `a` on the legacy stream
    outs = []
    for i, s in enumerate(streams):
        with s:
            outs.append(a * i)
    cupy.cuda.Device().synchronize()
    assert [float(o[0]) for o in outs] == [0, 1, 2]


def test_a_pinned_copy_reads_the_host_buffer_when_it_runs(cupy):
    import cupyx

    copy = cupy.cuda.Stream(non_blocking=True)
    pinned, pageable = cupyx.empty_pinned((4,), numpy.float32), numpy.empty(4, numpy.float32)
    to_pinned, to_pageable = cupy.empty(4, numpy.float32), cupy.empty(4, numpy.float32)
    pinned[...] = pageable[...] = 1
    copy.wait_event(cupy.cuda.Stream.null.record())  # the arrays' memory came from the legacy stream's pool
    to_pinned.set(pinned, stream=copy)
    to_pageable.set(pageable, stream=copy)
    pinned[...] = pageable[...] = 2  # overwritten before the copies ran
    copy.synchronize()
    assert (to_pinned.get() == 2).all() and (to_pageable.get() == 1).all()


@pytest.mark.parametrize("direction", ["to device", "to host"])
@pytest.mark.parametrize("waited", [True, False])
def test_a_copy_queued_on_registered_memory_faults_once_the_memory_is_unregistered(cupy, direction, waited):
    copy = cupy.cuda.Stream(non_blocking=True)
    host, device = numpy.full(4, 3, numpy.float32), cupy.full(4, 5, numpy.float32)
    copy.wait_event(cupy.cuda.Stream.null.record())
    cupy.cuda.runtime.hostRegister(host.ctypes.data, host.nbytes, 0)
    if direction == "to device":
        device.set(host, stream=copy)
    else:
        device.get(stream=copy, out=host, blocking=False)
    if waited:
        copy.synchronize()
    cupy.cuda.runtime.hostUnregister(host.ctypes.data)  # takes the device's mapping away, waiting for nothing
    if waited:
        value = 3 if direction == "to device" else 5
        assert (host == value).all() and (device.get() == value).all()
        return
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorIllegalAddress"):
        copy.synchronize()


def test_events_time_and_refuse_what_cuda_refuses(cupy):
    s = cupy.cuda.Stream(non_blocking=True)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(s)
    with s:
        cupy.ones(100) * 2
    end.record(s)
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorNotReady"):
        cupy.cuda.get_elapsed_time(start, end)
    end.synchronize()
    assert end.done and cupy.cuda.get_elapsed_time(start, end) >= 0
    untimed = cupy.cuda.Event(disable_timing=True)
    untimed.record()
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorInvalidResourceHandle"):
        cupy.cuda.get_elapsed_time(untimed, end)


def test_current_stream_and_devices(cupy):
    s = cupy.cuda.Stream()
    assert cupy.cuda.get_current_stream() == cupy.cuda.Stream.null and cupy.cuda.Stream.null.ptr == 0
    with s:
        assert cupy.cuda.get_current_stream() is s
    assert cupy.cuda.get_current_stream() == cupy.cuda.Stream.null
    with cupy.cuda.Device(1):
        with pytest.raises(RuntimeError, match=r"created on \(0\) does not match with the current device \(1\)"):
            with s:
                pass


def test_work_runs_when_something_waits_for_it_not_when_it_is_queued(cupy):
    ran = []
    cupy.cuda.Stream.null.launch_host_func(ran.append, "legacy")
    producer, consumer = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    producer.launch_host_func(ran.append, "producer")
    consumer.wait_event(producer.record())
    consumer.launch_host_func(ran.append, "consumer")
    assert ran == []  # queued, the legacy stream's work too; wait_event ran nothing
    consumer.synchronize()
    assert ran == ["producer", "consumer"]  # what the consumer waited for, and not the legacy stream's work
    cupy.cuda.Stream.null.synchronize()
    assert ran[-1] == "legacy"


def test_streams_that_nothing_orders_run_out_of_queue_order_and_a_seed_repeats_it(cupy):
    from layerforge_emulator import streams

    def schedule(seed):
        streams._device(0).rng.seed(seed)
        queues = [cupy.cuda.Stream(non_blocking=True) for _ in range(3)]
        order = []
        for i in range(12):
            queues[i % 3].launch_host_func(order.append, i)
        cupy.cuda.Device().synchronize()
        return order

    first = schedule(0)
    assert first != list(range(12)) and sorted(first) == list(range(12))
    assert all([i for i in first if i % 3 == k] == list(range(k, 12, 3)) for k in range(3))  # each stream in order
    assert schedule(0) == first and {tuple(schedule(seed)) for seed in range(8)} != {tuple(first)}
