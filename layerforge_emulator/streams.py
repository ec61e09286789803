"""Streams and events of the emulated devices, and the execution model every device operation goes through.

The execution model (stricter than a device, never wrong for correctly ordered code):

- Every operation that reads or writes device memory (an array operation, a copy, a cuBLAS call, a kernel,
  a collective) is *submitted* to the current stream of the current device (:func:`submit`) and queued there,
  on the legacy default stream (``Stream.null``) too. Nothing runs when it is queued.
- An operation runs when something waits for it: a host synchronisation of its stream (``synchronize``,
  ``.get()``, ``float()``, ...), of its device (``cudaDeviceSynchronize``, ``cudaFree``) or of an event recorded
  after it, or an operation that comes after it and is itself run. What comes after what: a stream's own
  order; ``wait_event`` (the waiting stream's later work comes after the event's work; nothing runs at the
  call); the legacy stream's implicit order (its operations come after the blocking streams' earlier work, and
  a blocking stream's after the legacy stream's earlier work; non-blocking streams are ordered by nothing).
- Work that nothing orders runs in an order that differs from the queue order (:meth:`_Device._pick`): mostly
  the stream queued to last goes first, so the others' work runs as late as nothing forbids. The choices are
  seeded (``LAYERFORGE_EMULATED_GPU_SEED``, 0 by default), so a schedule repeats. A missing synchronisation
  therefore reads stale data, or overwrites what pending work still needs, deterministically, instead of racing
  now and then.
- An operation that runs later refers to its arrays by address (:class:`Ref`), resolved through the
  allocation registry when it runs, as a device does: an array freed before that reads what the address
  holds then (or ``cudaErrorIllegalAddress`` if the memory went back to the device).
- A stream that is capturing (graphs.py) records its operations into the graph instead; none run.

Devices, current streams and events follow cupy's classes of the same names.
"""
import collections
import itertools
import os
import random
import threading
import time
import weakref
from typing import NamedTuple

import numpy

from . import graphs
from . import runtime
from .allocations import lookup
from .runtime import CUDARuntimeError

SEED_ENV = "LAYERFORGE_EMULATED_GPU_SEED"  # the scheduler's choices among unordered streams
_tickets = itertools.count(1)  # the order operations were queued in, across streams
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

    __slots__ = ("fn", "args", "name", "after", "ticket")

    def __init__(self, fn, args, name):
        self.fn, self.args, self.name, self.after, self.ticket = fn, args, name, (), 0

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
    """The work one stream (the legacy one included) has queued on one device: operations numbered from 1 in
    submission order; ``started`` / ``completed`` count those taken and finished."""

    def __init__(self, device, blocking, legacy=False):
        self.device, self.device_id, self.blocking, self.legacy = device, device.id, blocking, legacy
        self.ops, self.submitted, self.started, self.completed = collections.deque(), 0, 0, 0
        self.waits = []  # (queue, seq) that the next operation comes after (wait_event)
        self.runner = None  # the thread running this queue's operation now
        self.stream_alive = lambda: True

    def pending(self):
        return self.submitted > self.completed


def _seed():
    try:
        return int(os.environ.get(SEED_ENV, "0"))
    except ValueError:
        raise ValueError(f"{SEED_ENV} must be an integer, got {os.environ[SEED_ENV]!r}") from None


class _Device:
    """The queues of one device and the scheduler that runs them: an operation runs once something waits for
    it, after what it comes after (its stream's earlier work, the events its stream waited for, and the legacy
    stream's implicit order); among the streams whose next operation may run, a seeded random one goes first."""

    def __init__(self, device_id):
        self.id, self.cond = device_id, threading.Condition(threading.RLock())
        self.legacy = _Queue(self, blocking=True, legacy=True)
        self.queues = [self.legacy]
        self.rng = random.Random(_seed() * 7919 + device_id)

    def live_queues(self):
        self.queues[:] = [q for q in self.queues if q.legacy or q.pending() or q.stream_alive()]
        return list(self.queues)

    def push(self, queue, op):
        """Queue ``op`` on ``queue``; returns its number there."""
        with self.cond:
            after, queue.waits = queue.waits, []
            if queue.legacy:  # the legacy stream waits for the blocking streams' earlier work
                after += [(q, q.submitted) for q in self.live_queues() if q.blocking and not q.legacy and q.pending()]
            elif queue.blocking and self.legacy.pending():  # and they wait for its
                after.append((self.legacy, self.legacy.submitted))
            op.after, op.ticket = after, next(_tickets)
            queue.ops.append(op)
            queue.submitted += 1
            return queue.submitted

    def _closure(self, targets):
        """``targets`` (queue -> number) grown by everything they come after; the other devices' part apart."""
        others, todo = [], list(targets.items())
        while todo:
            queue, seq = todo.pop()
            for op in itertools.islice(queue.ops, 0, max(0, seq - queue.started)):
                for q, s in op.after:
                    if q.device is not self:
                        others.append((q, s))
                    elif s > targets.get(q, 0) and s > q.completed:
                        targets[q] = s
                        todo.append((q, s))
        return others

    def _pick(self, ready):
        """Which of the streams that may run goes first: mostly the one whose next operation was queued last
        (work nothing ordered runs late, so a consumer that did not wait sees its producer's old data), else a
        random one; seeded (``LAYERFORGE_EMULATED_GPU_SEED``), so a schedule repeats."""
        if len(ready) == 1:
            return ready[0]
        if self.rng.random() < 0.75:
            return max(ready, key=lambda q: q.ops[0].ticket)
        return ready[self.rng.randrange(len(ready))]

    def run(self, targets):
        """Run the operations up to ``targets`` (queue -> number) and everything they come after."""
        with self.cond:
            targets = {q: s for q, s in targets.items() if s > q.completed}
            others = self._closure(targets)
        for q, s in others:
            q.device.run({q: s})
        me = threading.get_ident()
        while True:
            with self.cond:
                left = [q for q, s in targets.items() if q.completed < s]
                if not left:
                    return
                ready = [q for q in left if q.started == q.completed and q.started < targets[q]
                         and all(d.completed >= s for d, s in q.ops[0].after)]
                if not ready:
                    if any(q.runner == me for q in self.queues):
                        return  # called from inside an operation this thread runs (a finalizer): it cannot wait
                    self.cond.wait(0.05)
                    continue
                queue = self._pick(ready)
                op = queue.ops.popleft()
                queue.started += 1
                queue.runner = me
            try:
                op.run()
            except BaseException:
                with self.cond:
                    # as after a device fault, the stream's later work is lost; it fails where it is waited for
                    queue.started = queue.completed = queue.submitted
                    queue.ops.clear()
                    queue.runner = None
                    self.cond.notify_all()
                raise
            with self.cond:
                queue.completed += 1
                queue.runner = None
                self.cond.notify_all()


_devices = {}


def _device(device_id):
    with _lock:
        device = _devices.get(device_id)
        if device is None:
            device = _devices[device_id] = _Device(device_id)
        return device


def _queue_of(stream):
    """The queue of ``stream`` (the legacy stream's of the current device)."""
    return _device(runtime.getDevice()).legacy if stream._is_legacy else stream._queue


def run_queue(queue, seq=None):
    """Run ``queue``'s work up to number ``seq`` (all of it for None) and what it comes after."""
    queue.device.run({queue: queue.submitted if seq is None else seq})


_by_ptr = weakref.WeakValueDictionary()  # handle -> Stream, for calls that take a raw stream (NCCL)


def synchronize_device(device_id):
    """``cudaDeviceSynchronize``: every queued operation of the device runs."""
    graphs.check_no_capture("cudaDeviceSynchronize", device_id)
    device = _device(device_id)
    with device.cond:
        queues = [q for q in device.live_queues() if q.ops]
        # one stream after another, each with only what it waited for: the stream queued to last goes first, so
        # the others' work runs after it, as late as nothing forbids (seeded: sometimes another order)
        queues.sort(key=lambda q: -q.ops[-1].ticket)
        if len(queues) > 1 and device.rng.random() < 0.25:
            device.rng.shuffle(queues)
        targets = [(q, q.submitted) for q in queues]
    for queue, seq in targets:
        device.run({queue: seq})


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
        device = _device(self.device_id)
        self._queue = _Queue(device, blocking=not self.non_blocking)
        _by_ptr[self.ptr] = self
        alive = weakref.ref(self)
        self._queue.stream_alive = lambda: alive() is not None
        with device.cond:
            device.queues.append(self._queue)

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
        run_queue(_queue_of(self))

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
        """Later work of this stream comes after the work before ``event`` (nothing runs now)."""
        graphs.check_wait(self, event)
        if event._mark is not None:
            queue, seq = event._mark
            mine = _queue_of(self)
            if queue is not mine and seq > queue.completed:
                with mine.device.cond:
                    mine.waits.append((queue, seq))

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

        self._mark = (_queue_of(stream), submit_host(stamp, "event record", stream))

    def synchronize(self):
        graphs.check_event(self)
        if self._mark is not None:
            run_queue(*self._mark)

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
    queue = _queue_of(stream)
    return queue.device.push(queue, Op(fn, _map_arrays(args, _ref_of, DeviceData), name))


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
