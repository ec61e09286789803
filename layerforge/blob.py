"""Blob: an N-d array with its gradient, as in Caffe (``data`` and ``diff`` of the same shape)."""
import numpy


class Blob:
    """Holds ``data`` and ``diff`` arrays of one shape and dtype.

    Args:
        shape: tuple of ints (N, C, H, W for images; any rank is allowed).
        dtype: numpy dtype of both arrays (float32 by default).
        xp: the array module (numpy, or cupy on a GPU).
    """

    def __init__(self, shape=(), dtype=numpy.float32, xp=numpy):
        self.xp = xp
        self.dtype = numpy.dtype(dtype)
        self.data = xp.zeros(tuple(int(s) for s in shape), dtype=self.dtype)
        self.diff = xp.zeros_like(self.data)

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
            self.data = self.data.reshape(shape)
            self.diff = self.diff.reshape(shape)
        else:
            self.data = self.xp.zeros(shape, dtype=self.dtype)
            self.diff = self.xp.zeros_like(self.data)
        return self

    def share_data(self, other):
        """Use ``other``'s data array (same storage), as Caffe's ShareData does for in-place views."""
        self.data = other.data

    def __repr__(self):
        return f"Blob(shape={self.shape}, dtype={self.dtype})"
