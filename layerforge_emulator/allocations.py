"""Device memory as CUDA hands it out: exact-size allocations at real host addresses, and the registry from
address to allocation that every pointer-taking call resolves through (memory.py has the rules).
"""
import bisect
import threading

import numpy

from . import runtime
from .graphs import check_capture_allows
from .runtime import CUDARuntimeError

ALIGN = 256
POISON = 0xFF
_lock = threading.RLock()


class Allocation:
    """One ``cudaMalloc``: ``size`` bytes at address ``ptr`` on ``device_id``; ``buffer`` is the uint8 numpy
    view of those bytes (used only by the emulator itself)."""

    __slots__ = ("ptr", "size", "device_id", "buffer", "live", "__weakref__")

    def __init__(self, size, device_id):
        raw = numpy.empty(size + ALIGN, numpy.uint8)
        start = -raw.ctypes.data % ALIGN
        self.buffer = raw[start:start + size]
        self.buffer.fill(POISON)
        self.ptr, self.size, self.device_id, self.live = self.buffer.ctypes.data, size, device_id, True

    def __repr__(self):
        return f"<allocation of {self.size} bytes at {self.ptr:#x} on device {self.device_id}>"


class _Registry:
    """Live allocations by address (sorted), and the bytes each device has handed out."""

    def __init__(self):
        self.starts, self.by_start, self.used = [], {}, {}

    def add(self, alloc):
        bisect.insort(self.starts, alloc.ptr)
        self.by_start[alloc.ptr] = alloc
        self.used[alloc.device_id] = self.used.get(alloc.device_id, 0) + alloc.size

    def remove(self, alloc):
        self.starts.pop(bisect.bisect_left(self.starts, alloc.ptr))
        del self.by_start[alloc.ptr]
        self.used[alloc.device_id] -= alloc.size

    def find(self, ptr, nbytes):
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0:
            alloc = self.by_start[self.starts[i]]
            if ptr + nbytes <= alloc.ptr + alloc.size:
                return alloc
        return None


_REGISTRY = _Registry()


def lookup(ptr, nbytes=1):
    """The live allocation holding the ``nbytes`` bytes at ``ptr``; ``cudaErrorIllegalAddress`` when none does."""
    with _lock:
        alloc = _REGISTRY.find(int(ptr), max(int(nbytes), 1))
    if alloc is None:
        raise CUDARuntimeError(runtime.errorIllegalAddress)
    return alloc


def host_view(ptr, nbytes):
    """The ``nbytes`` device bytes at ``ptr`` as a uint8 numpy array (through :func:`lookup`)."""
    if nbytes == 0:
        return numpy.empty(0, numpy.uint8)
    alloc = lookup(ptr, nbytes)
    start = ptr - alloc.ptr
    return alloc.buffer[start:start + nbytes]


def cuda_malloc(size, device_id):
    """``cudaMalloc``: a new exact-size :class:`Allocation`, or ``cudaErrorMemoryAllocation`` past the device's
    memory. Refused during capture where the capture mode forbids it (graphs.py)."""
    check_capture_allows("cudaMalloc", device_id)
    with _lock:
        if _REGISTRY.used.get(device_id, 0) + size > runtime.CONFIG.load().memory:
            raise CUDARuntimeError(runtime.errorMemoryAllocation)
        alloc = Allocation(size, device_id)
        _REGISTRY.add(alloc)
    return alloc


def release(alloc):
    """The unregistering half of ``cudaFree`` (memory.cuda_free waits for the device first)."""
    with _lock:
        if alloc.live:
            alloc.live = False
            _REGISTRY.remove(alloc)


def mem_info(device_id):
    """``cudaMemGetInfo`` of a device: (free bytes, total bytes)."""
    total = runtime.CONFIG.load().memory
    with _lock:
        return total - _REGISTRY.used.get(device_id, 0), total


def memGetInfo():
    return mem_info(runtime.getDevice())
