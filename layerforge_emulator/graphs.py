"""CUDA graph capture on the emulated devices: ``stream.begin_capture()`` records the stream's operations
(nothing runs), ``end_capture()`` returns a ``Graph`` (streams.py), ``Graph.launch(stream)`` submits them
again. This module holds the captures underway and the rules they impose.

A recorded operation holds its arrays by address, as a graph node holds raw pointers: a replay reads and
writes whatever the addresses hold then, and raises ``cudaErrorIllegalAddress`` if their memory went back
to the device. What capture refuses, with the error CUDA (or cupy, for its transfers) gives:

- a host synchronisation of the capturing stream (``stream.synchronize()``) or of its device
  (``cudaDeviceSynchronize``, also behind ``cudaFree``): ``cudaErrorStreamCaptureUnsupported``;
- a copy between host and device on the capturing stream (``.get()``, ``.set()``, ``float(a)``, boolean
  indexing...): cupy's ``RuntimeError('the current stream is capturing, so D2H transfers are disallowed')``
  (``H2D`` for a copy to the device), raised by cupy before CUDA sees it, so the capture goes on;
- use of the legacy stream while a *blocking* stream of the device captures:
  ``cudaErrorStreamCaptureImplicit``;
- waiting for an event recorded outside the capture: ``cudaErrorStreamCaptureIsolation``; synchronising or
  querying an event recorded in a capture underway: ``cudaErrorCapturedEvent``;
- allocation: cupy begins a capture in *relaxed* mode by default, where ``cudaMalloc`` is allowed, so a
  memory pool may grow during capture (cupy's own reason for choosing relaxed). Under
  ``streamCaptureModeGlobal`` / ``ThreadLocal``, ``cudaMalloc`` is a "potentially unsafe" call and raises
  ``cudaErrorStreamCaptureUnsupported``. ``cudaFree`` synchronises the device and raises in every mode:
  a pool that must release its cached blocks to satisfy an allocation mid-capture (it is over its limit
  or the device is full) fails there. Blocks taken from and returned to a pool during capture need no
  CUDA call and are always allowed.

An error other than cupy's transfer checks invalidates the capture: every later operation on the stream
and ``end_capture`` raise ``cudaErrorStreamCaptureInvalidated``. Not emulated: another stream joining a
capture through an event recorded in it (NotImplementedError).
"""
import threading

from . import runtime
from .runtime import CUDARuntimeError

streamCaptureModeGlobal, streamCaptureModeThreadLocal, streamCaptureModeRelaxed = 0, 1, 2
_captures = {}  # stream ptr -> _Capture
_lock = threading.RLock()


class _Capture:
    """One capture underway: its stream, mode and thread, the operations recorded, the error that ended it."""

    def __init__(self, stream, mode):
        self.stream, self.mode, self.thread = stream, mode, threading.get_ident()
        self.device_id = stream.device_id
        self.ops, self.error = [], None

    def add(self, op):
        if self.error is not None:
            raise CUDARuntimeError(runtime.errorStreamCaptureInvalidated)
        self.ops.append(op)

    def fail(self, status):
        """Invalidate the capture with ``status`` and raise it."""
        if self.error is None:
            self.error = status
        raise CUDARuntimeError(status)


def capture_of(stream):
    """The capture underway on ``stream``, or None."""
    return _captures.get(stream.ptr) if stream.ptr else None


def _underway(device_id=None):
    with _lock:
        return [c for c in _captures.values() if device_id is None or c.device_id == device_id]


def begin_capture(stream, mode=None):
    if stream.ptr in (0, 1):
        raise RuntimeError("cannot capture on the default (legacy) stream")
    with _lock:
        if stream.ptr in _captures:
            raise CUDARuntimeError(runtime.errorIllegalState)
        _captures[stream.ptr] = _Capture(stream, streamCaptureModeRelaxed if mode is None else int(mode))


def end_capture(stream):
    with _lock:
        capture = _captures.pop(stream.ptr, None)
    if capture is None:
        raise CUDARuntimeError(runtime.errorIllegalState)
    if capture.error is not None:
        raise CUDARuntimeError(runtime.errorStreamCaptureInvalidated)
    return capture.ops


def check_not_capturing(stream, what):
    """A host synchronisation of ``stream``: refused while it captures (and the legacy stream's, while a
    blocking stream of the device captures)."""
    capture = capture_of(stream)
    if capture is not None:
        capture.fail(runtime.errorStreamCaptureUnsupported)
    if stream.ptr == 0:
        check_legacy_use(runtime.getDevice())


def check_no_capture(what, device_id):
    """A synchronisation of the whole device: refused while any of its streams captures."""
    for capture in _underway(device_id):
        capture.fail(runtime.errorStreamCaptureUnsupported)


def check_legacy_use(device_id):
    """Work on the legacy stream would depend on a capturing blocking stream: refused."""
    for capture in _underway(device_id):
        if not capture.stream.non_blocking:
            capture.fail(runtime.errorStreamCaptureImplicit)


def check_capture_allows(what, device_id):
    """``cudaMalloc`` / ``cudaFree`` under the capture rules of the module text."""
    me = threading.get_ident()
    for capture in _underway():
        if what == "cudaFree":
            refused = capture.device_id == device_id
        elif capture.thread == me:
            refused = capture.mode != streamCaptureModeRelaxed
        else:
            refused = capture.mode == streamCaptureModeGlobal
        if refused:
            capture.fail(runtime.errorStreamCaptureUnsupported)


def record_event(stream, event):
    event._mark, event._captured, event._time = None, capture_of(stream), None


def _captured_underway(event):
    capture = event._captured
    return capture is not None and _captures.get(capture.stream.ptr) is capture


def check_event(event):
    """Synchronising, querying or timing an event recorded in a capture underway is refused."""
    if _captured_underway(event):
        raise CUDARuntimeError(runtime.errorCapturedEvent)


def check_wait(stream, event):
    """``stream.wait_event(event)`` under capture: within one capture it is a no-op here (one stream's order);
    a capturing stream may not wait for uncaptured work."""
    capture = capture_of(stream)
    if _captured_underway(event):
        if capture is not event._captured:
            raise NotImplementedError("the emulated device does not let another stream join a capture "
                                      "through an event recorded in it")
        return
    if capture is not None and event._mark is not None:
        capture.fail(runtime.errorStreamCaptureIsolation)
