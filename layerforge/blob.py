"""Blob: an N-d array with its gradient, as in Caffe (``data`` and ``diff`` of the same shape)."""
import os

import numpy

from .errors import ShapeError

# Allocations below this size skip the free-memory check (it reads /proc or asks the device).
_CHECKED_BYTES = 64 << 20


def available_bytes(xp=numpy):
    """Memory an allocation can still get: the device's free memory for cupy, MemAvailable (or all RAM) on the host."""
    if xp is not numpy:
        return int(xp.cuda.runtime.memGetInfo()[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def zeros_checked(shape, dtype, xp=numpy, what="a blob"):
    """``xp.zeros(shape, dtype)``, or a one-line ShapeError when it cannot fit in memory (never numpy's traceback)."""
    shape = tuple(int(s) for s in shape)
    nbytes = int(numpy.prod(shape, dtype=numpy.float64)) * numpy.dtype(dtype).itemsize
    if nbytes >= _CHECKED_BYTES:
        free = available_bytes(xp)
        if nbytes > free:
            raise ShapeError(f"{what} of shape {shape} needs {_gib(nbytes)}, more than the {_gib(free)} of "
                             f"memory available")
    try:
        return xp.zeros(shape, dtype=dtype)
    except (MemoryError, ValueError) as e:  # numpy says "array is too big" with a ValueError
        raise ShapeError(f"cannot allocate {what} of shape {shape} ({_gib(nbytes)}): {e}") from None


def _gib(nbytes):
    from .memory import format_bytes  # memory imports the kernels, which blob must not import at load
    return format_bytes(nbytes)


class Blob:
    """Holds ``data`` and ``diff`` arrays of one shape and dtype.

    Args:
        shape: tuple of ints (N, C, H, W for images; any rank is allowed).
        dtype: numpy dtype of both arrays (float32 by default).
        xp: the array module (numpy, or cupy on a GPU).
    """

    name = None  # what the blob is, for messages ("layer 'conv1' parameter 0"); the Net names its blobs

    def __init__(self, shape=(), dtype=numpy.float32, xp=numpy):
        self.xp = xp
        self.dtype = numpy.dtype(dtype)
        self._data = zeros_checked(shape, self.dtype, xp)
        self._diff = zeros_checked(shape, self.dtype, xp, "the gradient of a blob")

    # data and diff may be given new arrays (views, shared storage), but only of the blob's shape and dtype:
    # a wrong one would otherwise fail deep inside a kernel, far from the assignment
    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, array):
        self._data = self._checked(array, "data", getattr(self, "_data", None))

    @property
    def diff(self):
        return self._diff

    @diff.setter
    def diff(self, array):
        self._diff = self._checked(array, "diff", getattr(self, "_diff", None))

    def _checked(self, array, what, current):
        if array is None or current is None:
            return array
        if tuple(getattr(array, "shape", ())) != tuple(current.shape) or getattr(array, "dtype", None) != self.dtype:
            raise ShapeError(f"cannot give {self.name or 'a blob'} of shape {tuple(current.shape)} ({self.dtype}) a {what} array of "
                             f"shape {tuple(getattr(array, 'shape', ()))} ({getattr(array, 'dtype', type(array).__name__)}); "
                             f"copy values in with blob.{what}[...] = array, or blob.reshape(...) first")
        return array

    @property
    def shape(self):
        return self.data.shape

    @property
    def count(self):
        """Number of elements."""
        return int(self.data.size)

    @property
    def num(self):
        return self.data.shape[0]

    # Caffe's legacy 4-d accessors (axes 1, 2, 3; 1 where the blob has fewer axes), as pycaffe's Blob has them
    @property
    def channels(self):
        return self._legacy_axis(1)

    @property
    def height(self):
        return self._legacy_axis(2)

    @property
    def width(self):
        return self._legacy_axis(3)

    def _legacy_axis(self, axis):
        return self.data.shape[axis] if self.data.ndim > axis else 1

    def reshape(self, *shape):
        """Give the blob a new shape; memory is reallocated only when the element count changes.

        Accepts ``reshape(2, 3)`` or ``reshape((2, 3))``. Contents are unspecified after a size change.
        """
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        if shape == self.data.shape:
            return self
        size = int(numpy.prod(shape, dtype=numpy.int64))
        if size == self.data.size:
            self._data = self.data.reshape(shape)
            self._diff = self.diff.reshape(shape)
        else:
            self._data = self._diff = None  # the old arrays are freed before the new ones count against memory
            self._data = zeros_checked(shape, self.dtype, self.xp)
            self._diff = zeros_checked(shape, self.dtype, self.xp, "the gradient of a blob")
        return self

    def share_data(self, other):
        """Use ``other``'s data array (same storage), as Caffe's ShareData does for in-place views."""
        self.data = other.data

    def __repr__(self):
        return f"Blob(shape={self.shape}, dtype={self.dtype})"
