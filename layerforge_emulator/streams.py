"""Streams and events of the emulated devices, and the execution model every device operation goes through.

The execution model (stricter than a device, never wrong for correctly ordered code):

- Every operation that reads or writes device memory (an array operation, a copy, a cuBLAS call, a kernel,
  a collective) is *submitted* to the current stream of the current device (:func:`submit`).
- The legacy default stream (``Stream.null``) runs an operation at once, in the calling thread, after
  running what every blocking stream of the device still has queued (the legacy stream waits for them).
- Any other stream only queues its operations. They run, in order, when something orders them: a host
  synchronisation of that stream (``synchronize``, ``.get()``, ``float()``, ...), of the device, or of an
  event recorded after them; another stream waiting for such an event (``wait_event``, which runs the
  producer up to the event at once, a legal schedule); an operation on the legacy stream, for a blocking
  stream; ``cudaFree``. So a missing synchronisation reads stale data deterministically instead of
  racing: a consumer that does not wait runs before the producer's work.
- An operation that runs later refers to its arrays by address (:class:`Ref`), resolved through the
  allocation registry when it runs, as a device does: an array freed before that reads what the address
  holds then (or ``cudaErrorIllegalAddress`` if the memory went back to the device).
- A stream that is capturing (graphs.py) records its operations into the graph instead; none run.

Devices, current streams and events follow cupy's classes of the same names.
"""
import collections
import itertools
import threading
import time
import weakref
from typing import NamedTuple

import numpy

from . import graphs
from . import runtime
from .allocations import lookup
from .runtime import CUDARuntimeError

_handles = itertools.count(0x5000)  # fake cudaStream_t / cudaEvent_t handles
_lock = threading.RLock()
_local = threading.local()


class DeviceData:
    """Base of the emulated ``cupy.ndarray``: ``_ref()`` (a :class:`Ref`) and ``_host`` (its numpy view)."""

    __slots__ = ()


class Ref(NamedTuple):
    """An array as a deferred operation holds it: by address, as a kernel argument does."""

    ptr: int
    shape: tuple
    strides: tuple
    dtype: numpy.dtype
    device_id: int

    def resolve(self):
        """The numpy view of the bytes at ``ptr`` now (``cudaErrorIllegalAddress`` when no live allocation has them)."""
        if 0 in self.shape:
            return numpy.empty(self.shape, self.dtype)
        low = sum(s * (n - 1) for n, s in zip(self.shape, self.strides) if s < 0)
        high = sum(s * (n - 1) for n, s in zip(self.shape, self.strides) if s > 0) + self.dtype.itemsize
        alloc = lookup(self.ptr + low, high - low)
        return numpy.ndarray(self.shape, self.dtype, buffer=alloc.buffer, offset=self.ptr - alloc.ptr,
                             strides=self.strides)


class Op:
    """One device operation: ``fn(*args)`` with every :class:`Ref` in ``args`` resolved when it runs."""

    __slots__ = ("fn", "args", "name")

    def __init__(self, fn, args, name):
        self.fn, self.args, self.name = fn, args, name

    def run(self):
        self.fn(*_map_arrays(self.args, Ref.resolve, Ref))

    def __repr__(self):
        return f"<op {self.name}>"


def _map_arrays(args, fn, kind):
    """``args`` with ``fn`` applied to every item of type ``kind``, inside tuples and lists too."""
    out = []
    for a in args:
        if isinstance(a, kind):
            a = fn(a)
        elif type(a) in (tuple, list):
            a = type(a)(_map_arrays(a, fn, kind))
        out.append(a)
    return out


class _Queue:
    """The work one stream has queued on one device, run in order by whoever orders it."""

    def __init__(self, device_id, blocking):
        self.device_id, self.blocking = device_id, blocking
        self.ops, self.submitted, self.completed = collections.deque(), 0, 0
        self.lock = threading.RLock()

    def push(self, op):
        with self.lock:
            self.ops.append(op)
            self.submitted += 1
            return self.submitted

    def run_until(self, seq):
        """Run the queued operations up to number ``seq`` (1-based; all of them for None)."""
        with self.lock:
            seq = self.submitted if seq is None else seq
            while self.completed < seq:
                op = self.ops.popleft()
                self.completed += 1
                try:
                    op.run()
                except BaseException:
                    # as after a device fault, the stream's later work is lost; it fails where it is waited for
                    self.completed += len(self.ops)
                    self.ops.clear()
                    raise


_queues = collections.defaultdict(list)  # device -> [_Queue] of the non-legacy streams
_by_ptr = weakref.WeakValueDictionary()  # handle -> Stream, for calls that take a raw stream (NCCL)


def _queues_of(device_id):
    with _lock:
        queues = _queues[device_id]
        queues[:] = [q for q in queues if q.ops or q.stream_alive()]
        return list(queues)


def flush_blocking(device_id):
    """What the legacy stream waits for before its next operation: the queued work of blocking streams."""
    for queue in _queues_of(device_id):
        if queue.blocking:
            queue.run_until(None)


def synchronize_device(device_id):
    """``cudaDeviceSynchronize``: every queued operation of the device runs."""
    graphs.check_no_capture("cudaDeviceSynchronize", device_id)
    for queue in _queues_of(device_id):
        queue.run_until(None)


def deviceSynchronize():
    synchronize_device(runtime.getDevice())


class Stream:
    """``cupy.cuda.Stream``: ``Stream()`` a blocking stream, ``Stream(non_blocking=True)`` one that does not
    wait for the legacy stream, ``Stream.null`` the legacy default stream (``ptr`` 0). Made on the current
    device; ``with stream:`` / ``use()`` make it the current stream of that device (a RuntimeError on
    another device, as cupy's check)."""

    null = None  # set below

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=0):
        if ptds:
            raise NotImplementedError("the emulated device has no per-thread default stream")
        self.non_blocking = bool(non_blocking)
        if null:
            self.ptr, self.device_id, self._queue = 0, -1, None
            return
        self.ptr, self.device_id = next(_handles), runtime.getDevice()
        runtime.check_device(self.device_id)
        self._queue = _Queue(self.device_id, blocking=not self.non_blocking)
        _by_ptr[self.ptr] = self
        alive = weakref.ref(self)
        self._queue.stream_alive = lambda: alive() is not None
        with _lock:
            _queues[self.device_id].append(self._queue)

    @property
    def _is_legacy(self):
        return self.ptr == 0

    @property
    def is_non_blocking(self):
        return self.non_blocking

    def __eq__(self, other):
        return isinstance(other, Stream) and other.ptr == self.ptr

    def __hash__(self):
        return self.ptr

    def __repr__(self):
        return f"<{type(self).__name__} {self.ptr} (device {self.device_id})>"

    def _check_device(self):
        current = runtime.getDevice()
        device_id = current if self.device_id == -1 else self.device_id
        if device_id != current:
            raise RuntimeError(f"The device that the stream is created on ({device_id}) does not match with "
                               f"the current device ({current})")
        return device_id

    def __enter__(self):
        device_id = self._check_device()
        stacks = _stacks()
        stacks.setdefault(device_id, [Stream.null]).append(self)
        _local.__dict__.setdefault("pushed", []).append(device_id)
        return self

    def __exit__(self, *args):
        _stacks()[_local.pushed.pop()].pop()

    def use(self):
        device_id = self._check_device()
        stack = _stacks().setdefault(device_id, [Stream.null])
        stack[-1] = self
        return self

    def synchronize(self):
        """Wait for the stream's work (``cudaErrorStreamCaptureUnsupported`` while it captures)."""
        graphs.check_not_capturing(self, "cudaStreamSynchronize")
        if self._is_legacy:
            flush_blocking(runtime.getDevice())
        else:
            self._queue.run_until(None)

    @property
    def done(self):
        """True once the stream's work is done: the emulator finishes it here, as a device would meanwhile."""
        self.synchronize()
        return True

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event):
        """Later work of this stream comes after the work before ``event``: that work runs now."""
        graphs.check_wait(self, event)
        if event._mark is not None:
            queue, seq = event._mark
            if queue is not self._queue:
                queue.run_until(seq)

    def add_callback(self, callback, arg):
        submit_host(lambda: callback(self, 0, arg), "stream callback", self)

    def launch_host_func(self, callback, arg):
        submit_host(lambda: callback(arg), "host function", self)

    def begin_capture(self, mode=None):
        graphs.begin_capture(self, mode)

    def end_capture(self):
        return Graph(graphs.end_capture(self))

    def is_capturing(self):
        return graphs.capture_of(self) is not None


Stream.null = Stream(null=True)


def _stacks():
    stacks = getattr(_local, "stacks", None)
    if stacks is None:
        stacks = _local.stacks = {}
    return stacks


def get_current_stream(device_id=-1):
    """cupy's ``get_current_stream``: the calling thread's current stream of a device (the legacy one until set)."""
    device_id = runtime.getDevice() if device_id == -1 else device_id
    return _stacks().get(device_id, [Stream.null])[-1]


def stream_from_ptr(ptr):
    """The stream of a raw handle (0: the legacy stream); cudaErrorInvalidResourceHandle for an unknown one."""
    if not ptr:
        return Stream.null
    stream = _by_ptr.get(ptr)
    if stream is None:
        raise CUDARuntimeError(runtime.errorInvalidResourceHandle)
    return stream


def current_stream_ptr():
    return get_current_stream().ptr


class Event:
    """``cupy.cuda.Event``: ``record(stream)`` marks the stream's work so far; ``synchronize()`` waits for it,
    ``done`` finishes it (the emulator runs it then); :func:`get_elapsed_time` gives the host
    time between two events' completions in ms (a real figure only for what ran meanwhile)."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.ptr, self.disable_timing = next(_handles), bool(disable_timing)
        self._mark = None  # (queue, seq) of the last record outside capture
        self._captured = None  # the capture that last recorded it, if that is where
        self._time = None

    def __repr__(self):
        return f"<Event {self.ptr}>"

    def record(self, stream=None):
        stream = get_current_stream() if stream is None else stream
        if graphs.capture_of(stream) is not None:
            graphs.record_event(stream, self)
            return
        self._captured, self._time = None, None

        def stamp():
            self._time = time.perf_counter()

        if stream._is_legacy:
            self._mark = None
            submit_host(stamp, "event record", stream)
        else:
            self._mark = (stream._queue, submit_host(stamp, "event record", stream))

    def synchronize(self):
        graphs.check_event(self)
        if self._mark is not None:
            self._mark[0].run_until(self._mark[1])

    @property
    def done(self):
        self.synchronize()
        return True


def get_elapsed_time(start_event, end_event):
    """Milliseconds between two recorded, completed events (cupy's errors for unrecorded or untimed ones)."""
    for event in (start_event, end_event):
        graphs.check_event(event)
        if event.disable_timing:
            raise CUDARuntimeError(runtime.errorInvalidResourceHandle)
        if event._mark is not None and event._mark[0].completed < event._mark[1]:
            raise CUDARuntimeError(runtime.errorNotReady)
        if event._time is None:
            raise CUDARuntimeError(runtime.errorInvalidResourceHandle)
    return (end_event._time - start_event._time) * 1e3


def _check_arrays(args, device_id):
    """cupy's check of an operand on another device (the emulated devices have no peer access)."""
    for a in args:
        if isinstance(a, DeviceData):
            if a.data.device_id != device_id:
                raise ValueError(f"The device where the array resides ({a.data.device_id}) is different from "
                                 f"the current device ({device_id}). Peer access is unavailable between these "
                                 "devices.")
        elif type(a) in (tuple, list):
            _check_arrays(a, device_id)


def _ref_of(array):
    return array._ref()


def submit(fn, *args, name="operation", stream=None):
    """Run ``fn(*args)`` on ``stream`` (the current one) under the execution model of this module: at once on
    the legacy stream, queued on another, recorded under capture. Device arrays in ``args`` (also inside
    tuples and lists) reach ``fn`` as numpy views of their memory. Returns the queue position (None when
    it ran or was recorded)."""
    device_id = runtime.getDevice()
    stream = get_current_stream(device_id) if stream is None else stream
    _check_arrays(args, device_id)
    capture = graphs.capture_of(stream)
    if capture is not None:
        capture.add(Op(fn, _map_arrays(args, _ref_of, DeviceData), name))
        return None
    if stream._is_legacy:
        graphs.check_legacy_use(device_id)
        flush_blocking(device_id)
        fn(*_map_arrays(_map_arrays(args, lambda a: a._host, DeviceData), Ref.resolve, Ref))
        return None
    return stream._queue.push(Op(fn, _map_arrays(args, _ref_of, DeviceData), name))


def host_views(args):
    """``args`` with every device array as its numpy view (for work already ordered on the host)."""
    return _map_arrays(args, lambda a: a._host, DeviceData)


def submit_host(fn, name, stream):
    """Host work ordered on a stream (an event's time stamp, a host function)."""
    return submit(fn, name=name, stream=stream)


def host_sync(stream=None):
    """What cupy does before handing device data to the host: the stream's work runs first."""
    (get_current_stream() if stream is None else stream).synchronize()


class Graph:
    """``cupy.cuda.Graph``: the operations a capture recorded; ``launch(stream)`` submits them again, in order,
    to ``stream`` (the current one when None), where they run as that stream runs its work."""

    def __init__(self, ops):
        self._ops = list(ops)

    def launch(self, stream=None):
        stream = get_current_stream() if stream is None else stream
        for op in self._ops:
            submit(op.run, name=op.name, stream=stream)

    def upload(self, stream=None):
        """Nothing to prepare on the emulated device."""

    def __len__(self):
        return len(self._ops)
