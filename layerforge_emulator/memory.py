"""Device memory of the emulated devices: exact-size allocations at real host addresses, cupy's memory pool.

What it reproduces, and where it is stricter than a device:

- ``cudaMalloc`` (allocations.py) gives an allocation of exactly the bytes asked for (cupy's pool rounds
  to 512; the emulator does not, so reading past the end of an array reads past the end of its
  allocation), aligned to 256 bytes, filled with 0xFF bytes (NaN for floats) so that reading memory
  nobody wrote shows. Its address is a real host address: kernels and cuBLAS dereference it.
- Every live allocation is in a registry from address to allocation (``allocations.lookup``): a pointer handed to
  cuBLAS, NCCL, a kernel or a copy is resolved there, and one outside every live allocation raises
  ``cudaErrorIllegalAddress``.
- A device has ``LAYERFORGE_EMULATED_GPU_MEMORY`` bytes (runtime.py); ``cudaMalloc`` beyond it raises
  ``cudaErrorMemoryAllocation``, which cupy's pool turns into ``OutOfMemoryError`` with cupy's message after
  releasing its cached blocks.
- :class:`MemoryPool` is cupy's: blocks freed by arrays stay cached for the same device, stream and size
  (reused blocks are poisoned again), ``used_bytes`` / ``total_bytes`` / ``free_bytes`` / ``set_limit`` /
  ``free_all_blocks`` as cupy's. The allocator in force is cupy's: ``set_allocator`` globally,
  ``using_allocator`` for the calling thread.
- During graph capture, ``cudaMalloc`` obeys the capture mode (allowed in cupy's default relaxed mode,
  ``cudaErrorStreamCaptureUnsupported`` in global / thread-local mode) and ``cudaFree`` always raises
  (graphs.py has the rule).
- Pinned host memory (``cupyx.empty_pinned``, ``runtime.hostRegister``) is tracked by address range: a
  copy from or to a pinned range runs when its stream runs it, one from pageable memory reads the host
  buffer at the call (as ``cudaMemcpyAsync`` stages pageable memory). A queued copy whose range was
  unregistered before it ran raises ``cudaErrorIllegalAddress`` (:func:`check_pinned`): ``cudaHostUnregister``
  does not wait for the copies that use the range, and takes the device's mapping of it away.
"""
import bisect
import contextlib
import functools
import gc
import threading
import weakref

import numpy

from . import runtime, streams
from .allocations import POISON, cuda_malloc, mem_info, memGetInfo, release  # noqa: F401 - cupy's names
from .device import Device
from .graphs import capture_of, check_capture_allows
from .runtime import CUDARuntimeError

_lock = threading.RLock()


class OutOfMemoryError(MemoryError):
    """cupy's ``cupy.cuda.memory.OutOfMemoryError`` with its message."""

    def __init__(self, size, total, limit=0):
        self._size, self._total, self._limit = size, total, limit
        if limit == 0:
            msg = "Out of memory allocating {:,} bytes".format(size)
            if total != -1:
                msg += " (allocated so far: {:,} bytes).".format(total)
        else:
            msg = ("Out of memory allocating {:,} bytes (allocated so far: {:,} bytes, "
                   "limit set to: {:,} bytes).".format(size, total, limit))
        super().__init__(msg)

    def __reduce__(self):
        return type(self), (self._size, self._total, self._limit)


def cuda_free(alloc):
    """``cudaFree``: waits for the device's queued work (it synchronises), then releases the allocation."""
    check_capture_allows("cudaFree", alloc.device_id)
    streams.synchronize_device(alloc.device_id)
    release(alloc)


class BaseMemory:
    """cupy's memory objects: ``ptr``, ``size``, ``device_id``; the allocation is released (or returned to
    its pool) when the last array holding it is gone."""

    def __init__(self, alloc, device_id, release=None):
        self.alloc, self.device_id = alloc, device_id
        self.ptr = alloc.ptr if alloc is not None else 0
        self.size = alloc.size if alloc is not None else 0
        if release is not None:
            weakref.finalize(self, release, alloc)

    @property
    def device(self):
        return Device(self.device_id)


class MemoryPointer:
    """cupy's ``MemoryPointer``: ``mem`` (the memory) and ``ptr`` (an address inside it)."""

    def __init__(self, mem, offset):
        self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, mem.device_id

    @property
    def device(self):
        return Device(self.device_id)

    def __int__(self):
        return self.ptr

    def __add__(self, offset):
        return MemoryPointer(self.mem, self.ptr - self.mem.ptr + offset)

    def __repr__(self):
        return f"<MemoryPointer {self.ptr:#x} on device {self.device_id}>"


def _free_quietly(alloc):
    try:
        cuda_free(alloc)
    except Exception:  # noqa: BLE001 - a finalizer cannot raise; cudaFree in capture is reported by free_all_blocks
        pass


def _malloc(size):
    """cupy's raw allocator (no pool): ``cudaMalloc`` now, ``cudaFree`` when the memory is gone."""
    device_id = runtime.getDevice()
    if size == 0:
        return MemoryPointer(BaseMemory(None, device_id), 0)
    try:
        alloc = cuda_malloc(size, device_id)
    except CUDARuntimeError as e:
        if e.status != runtime.errorMemoryAllocation:
            raise
        raise OutOfMemoryError(size, -1) from None
    return MemoryPointer(BaseMemory(alloc, device_id, _free_quietly), 0)


class MemoryPool:
    """cupy's ``MemoryPool`` (all devices; every query is about the current device).

    Freed blocks stay cached under (device, stream, size), as cupy's pool keeps a free list per stream, and
    are handed out again only for the same three. ``malloc`` past ``set_limit`` or the device's memory
    releases the cached blocks of the device and tries again, then raises ``OutOfMemoryError``.
    """

    def __init__(self, allocator=None):
        self._free = {}  # (device, stream ptr, size) -> [Allocation]
        self._in_use, self._total, self._limit = {}, {}, 0

    def malloc(self, size):
        size, device_id = int(size), runtime.getDevice()
        if size == 0:
            return MemoryPointer(BaseMemory(None, device_id), 0)
        key = (device_id, streams.current_stream_ptr(), size)
        with _lock:
            blocks = self._free.get(key)
            alloc = blocks.pop() if blocks else None
            reused = alloc is not None
            if alloc is None:
                alloc = self._try_malloc(size, device_id)
            self._in_use[device_id] = self._in_use.get(device_id, 0) + size
        if reused and capture_of(streams.get_current_stream()) is None:
            # a reused block is poisoned in stream order: queued work may still read its last contents
            streams.submit(alloc.buffer.fill, POISON, name="poison reused block")
        return MemoryPointer(BaseMemory(alloc, device_id, functools.partial(self._give_back, key)), 0)

    def _try_malloc(self, size, device_id):
        limit = self._limit
        if limit and self._total.get(device_id, 0) + size > limit:
            self.free_all_blocks()
            if self._total.get(device_id, 0) + size > limit:
                raise OutOfMemoryError(size, self._total.get(device_id, 0), limit)
        for attempt in range(2):
            try:
                alloc = cuda_malloc(size, device_id)
                break
            except CUDARuntimeError as e:
                if e.status != runtime.errorMemoryAllocation:
                    raise
                if attempt:
                    raise OutOfMemoryError(size, self._total.get(device_id, 0), limit) from None
                gc.collect()  # arrays no one holds give their blocks back, then the cache goes to the device
                self.free_all_blocks()
        self._total[device_id] = self._total.get(device_id, 0) + size
        return alloc

    def _give_back(self, key, alloc):
        with _lock:
            self._in_use[key[0]] -= key[2]
            self._free.setdefault(key, []).append(alloc)

    def free_all_blocks(self, stream=None):
        """Release the cached blocks of the current device (of one stream when given) to the device."""
        device_id = runtime.getDevice()
        with _lock:
            keys = [k for k in self._free if k[0] == device_id and (stream is None or k[1] == stream.ptr)]
            released = [(k, self._free.pop(k)) for k in keys]
        for key, blocks in released:
            for i, alloc in enumerate(blocks):
                try:
                    cuda_free(alloc)
                except BaseException:
                    with _lock:  # still cached: cudaFree refused it (capture)
                        self._free.setdefault(key, []).extend(blocks[i:])
                    raise
                with _lock:
                    self._total[device_id] -= alloc.size

    def used_bytes(self):
        return self._in_use.get(runtime.getDevice(), 0)

    def total_bytes(self):
        return self._total.get(runtime.getDevice(), 0)

    def free_bytes(self):
        return self.total_bytes() - self.used_bytes()

    def n_free_blocks(self):
        device_id = runtime.getDevice()
        return sum(len(v) for k, v in self._free.items() if k[0] == device_id)

    def set_limit(self, size=None, fraction=None):
        if size is None:
            if fraction is None:
                size = 0
            else:
                if not 0 <= fraction <= 1:
                    raise ValueError(f"memory limit fraction out of range: {fraction}")
                size = fraction * memGetInfo()[1]
        elif fraction is not None:
            raise ValueError("size and fraction cannot be specified at one time")
        if size < 0:
            raise ValueError(f"memory limit size out of range: {size}")
        self._limit = int(size)

    def get_limit(self):
        return self._limit


_DEFAULT_POOL = MemoryPool()
_allocator = {"global": _DEFAULT_POOL.malloc}
_thread = threading.local()


def get_default_memory_pool():
    return _DEFAULT_POOL


def get_allocator():
    return getattr(_thread, "allocator", None) or _allocator["global"]


def set_allocator(allocator=None):
    if getattr(_thread, "allocator", None) is not None:
        raise ValueError("Can't change the global allocator inside `using_allocator` context manager")
    _allocator["global"] = allocator or _malloc


@contextlib.contextmanager
def using_allocator(allocator=None):
    """cupy's ``using_allocator``: ``allocator`` (cupy's raw ``cudaMalloc`` when None) for this thread."""
    previous = getattr(_thread, "allocator", None)
    _thread.allocator = allocator or _malloc
    try:
        yield
    finally:
        _thread.allocator = previous


def alloc(size):
    """cupy's ``cupy.cuda.alloc``: memory from the allocator in force."""
    return get_allocator()(size)


# ---- pinned (page-locked) host memory -------------------------------------------------------------------

class _Pinned:
    """Host address ranges that are page-locked: made by :func:`empty_pinned` or ``hostRegister``."""

    def __init__(self):
        self.starts, self.ends = [], {}

    def add(self, ptr, size):
        i = bisect.bisect_right(self.starts, ptr)
        if (i and self.ends[self.starts[i - 1]] > ptr) or (i < len(self.starts) and self.starts[i] < ptr + size):
            raise CUDARuntimeError(runtime.errorHostMemoryAlreadyRegistered)
        self.starts.insert(i, ptr)
        self.ends[ptr] = ptr + size

    def remove(self, ptr):
        if ptr not in self.ends:
            raise CUDARuntimeError(runtime.errorHostMemoryNotRegistered)
        self.starts.remove(ptr)
        del self.ends[ptr]

    def holds(self, ptr, nbytes):
        i = bisect.bisect_right(self.starts, ptr) - 1
        return i >= 0 and ptr + nbytes <= self.ends[self.starts[i]]


_PINNED = _Pinned()


def hostRegister(ptr, size, flags):
    """``cudaHostRegister``: page-lock ``size`` bytes of host memory at ``ptr``."""
    with _lock:
        _PINNED.add(int(ptr), int(size))


def hostUnregister(ptr):
    with _lock:
        _PINNED.remove(int(ptr))


def is_pinned(ptr, nbytes):
    """True when the host bytes ``[ptr, ptr + nbytes)`` are page-locked."""
    with _lock:
        return nbytes > 0 and _PINNED.holds(int(ptr), int(nbytes))


def check_pinned(host):
    """What a queued copy from or to the page-locked host array ``host`` does first: cudaErrorIllegalAddress
    when its bytes are no longer page-locked (``hostUnregister`` unmapped them from the device)."""
    if not is_pinned(host.ctypes.data, host.nbytes):
        raise CUDARuntimeError(runtime.errorIllegalAddress)


def _unpin(ptr):
    with _lock:
        _PINNED.remove(ptr)


def empty_pinned(shape, dtype=float, order="C"):
    """``cupyx.empty_pinned``: a numpy array in page-locked host memory (poisoned, as device memory is)."""
    dtype = numpy.dtype(dtype)
    count = int(numpy.prod(shape, dtype=numpy.int64))
    nbytes = count * dtype.itemsize
    raw = numpy.empty(max(nbytes, 1), numpy.uint8)
    raw.fill(POISON)
    hostRegister(raw.ctypes.data, raw.nbytes, 0)
    # unpinned when the buffer dies, not at exit, where finalizers run whether or not it lives (a copy still queued
    # from it would fault as from unregistered memory)
    weakref.finalize(raw, _unpin, raw.ctypes.data).atexit = False
    return numpy.ndarray(shape, dtype, buffer=raw, order=order)


def zeros_pinned(shape, dtype=float, order="C"):
    out = empty_pinned(shape, dtype, order)
    out[...] = 0
    return out
