"""Blob: an N-d array with its gradient, as in Caffe (``data`` and ``diff`` of the same shape).

A parameter whose gradient touches few rows (an embedding table) may also hold it as a
:class:`SparseGradient`: the rows are kept apart and added into ``diff`` the first time ``diff`` is read, so
code that reads ``diff`` always sees the full gradient, and code that knows rows (the data-parallel sparse
aggregation, ``sparse_update: lazy``) reads :meth:`Blob.sparse_diff` without ever making the dense array.
"""
import os

import numpy

from .backend import get_array_module
from .errors import ShapeError
from .logs import format_bytes

# Allocations below this size skip the free-memory check (it reads /proc or asks the device).
_CHECKED_BYTES = 64 << 20


def available_bytes(xp=numpy):
    """Memory an allocation can still get: for cupy the device's free memory plus what cupy's pool holds unused
    (cudaMemGetInfo counts the pool's cached blocks as used); MemAvailable (or all RAM) on the host."""
    if xp is not numpy:
        return int(xp.cuda.runtime.memGetInfo()[0]) + int(xp.get_default_memory_pool().free_bytes())
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
    return format_bytes(nbytes)


class SparseGradient:
    """A gradient that is zero outside a few rows: ``dense[indices[k]] = rows[k]``, every other row 0.

    Attributes:
        indices: (k,) int64 row numbers, unique and ascending.
        rows: (k,) + row shape, the gradient's dtype; numpy or cupy (with ``indices`` on the same module).
    """

    def __init__(self, indices, rows):
        self.indices, self.rows = indices, rows

    @classmethod
    def coalesce(cls, indices, rows):
        """Sum the rows of repeated indices and sort: any (indices (k,), rows (k, ...)) -> a SparseGradient."""
        xp = get_array_module(rows)
        unique, inverse = xp.unique(xp.asarray(indices, dtype=xp.int64).reshape(-1), return_inverse=True)
        inverse = inverse.reshape(-1)
        summed = xp.zeros((len(unique),) + tuple(rows.shape[1:]), dtype=rows.dtype)
        if len(unique) == len(inverse):
            summed[inverse] = rows
            return cls(unique, summed)
        # a 1-d scatter-add of every element is several times faster than add.at over whole rows
        width = int(numpy.prod(rows.shape[1:], dtype=numpy.int64))
        flat = (inverse[:, None] * width + xp.arange(width)).reshape(-1)
        xp.add.at(summed.reshape(-1), flat, rows.reshape(-1))
        return cls(unique, summed)

    @classmethod
    def from_dense(cls, dense):
        """The rows of ``dense`` (first axis) that hold a non-zero value."""
        xp = get_array_module(dense)
        indices = xp.flatnonzero(dense.reshape(len(dense), -1).any(axis=1)).astype(xp.int64)
        return cls(indices, dense[indices])

    @classmethod
    def empty(cls, row_shape, dtype, xp=numpy):
        return cls(xp.zeros(0, xp.int64), xp.zeros((0,) + tuple(row_shape), dtype))

    def add_to(self, dense):
        """``dense[indices] += rows`` (indices are unique, so plain fancy indexing adds every row once)."""
        dense[self.indices] += self.rows

    @property
    def nbytes(self):
        """Bytes of indices and rows together (what a sparse exchange sends)."""
        return int(self.indices.nbytes + self.rows.nbytes)

    def __len__(self):
        return len(self.indices)

    def __repr__(self):
        return f"SparseGradient({len(self)} rows of shape {tuple(self.rows.shape[1:])})"


def pack_diffs(blobs, buffer, offsets):
    """Move the diffs of ``blobs`` into ``buffer``: blob k's diff becomes the view ``buffer[off:off + n]`` (shaped
    as the diff, ``offsets[k] = (off, n)``), its values kept. Backward then writes the gradients straight into
    the buffer (a replica's slot of shared memory), and what is written into the buffer is the gradient."""
    for b, (off, n) in zip(blobs, offsets):
        view = buffer[off:off + n].reshape(b.diff.shape)
        view[...] = b.diff
        b.diff = view


def pack_data(blobs, buffer, offsets, keep=()):
    """Make the data of ``blobs`` views of their segments of ``buffer`` (as :func:`pack_diffs`), whose values they
    take (no copy), except the blobs whose indices are in ``keep``."""
    for k, (b, (off, n)) in enumerate(zip(blobs, offsets)):
        if k not in keep:
            b.data = buffer[off:off + n].reshape(b.data.shape)


class Blob:
    """Holds ``data`` and ``diff`` arrays of one shape and dtype.

    Args:
        shape: tuple of ints (N, C, H, W for images; any rank is allowed).
        dtype: numpy dtype of both arrays (float32 by default).
        xp: the array module (numpy, or cupy on a GPU).
    """

    name = None  # what the blob is, for messages ("layer 'conv1' parameter 0"); the Net names its blobs
    sparse_rows = False  # True when a layer adds this parameter's gradient as rows (add_sparse_diff)

    def __init__(self, shape=(), dtype=numpy.float32, xp=numpy):
        self.xp = xp
        self.dtype = numpy.dtype(dtype)
        self._data = zeros_checked(shape, self.dtype, xp)
        self._diff = zeros_checked(shape, self.dtype, xp, "the gradient of a blob")
        self._pending = []  # SparseGradients not yet added into _diff
        self._diff_zero = True  # _diff is known to be all zero: the gradient is exactly the pending rows
        self._zeros_due = False  # the gradient is zero but _diff not yet written so (defer_clear_diff)

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
        self._flush()
        self._diff_zero = False  # the caller may write into it
        return self._diff

    @diff.setter
    def diff(self, array):
        self._flush()  # pending rows belong to the array being replaced
        self._diff = self._checked(array, "diff", getattr(self, "_diff", None))
        self._diff_zero = self._zeros_due = False

    def _flush(self):
        if getattr(self, "_zeros_due", False):
            self._zeros_due = False
            self._diff[...] = 0
        pending = getattr(self, "_pending", None)
        if pending:
            self._pending = []
            self._coalesced(pending).add_to(self._diff)

    @staticmethod
    def _coalesced(pending):
        if len(pending) == 1:
            return pending[0]
        xp = get_array_module(pending[0].rows)
        return SparseGradient.coalesce(xp.concatenate([g.indices for g in pending]),
                                       xp.concatenate([g.rows for g in pending]))

    def add_sparse_diff(self, indices, rows):
        """Add a gradient that touches only ``indices`` (k,) of the first axis, ``rows`` (k,) + shape[1:]:
        ``diff[indices] += rows`` with repeated indices summed, kept as rows until ``diff`` is read."""
        self._pending.append(SparseGradient.coalesce(indices, rows))

    def sparse_diff(self):
        """The gradient as a :class:`SparseGradient` (exactly the added rows while nothing wrote ``diff``,
        else the non-zero rows of ``diff``); writing into its ``rows`` changes the gradient."""
        if not self._diff_zero:
            return SparseGradient.from_dense(self.diff)
        if not self._pending:
            return SparseGradient.empty(self.shape[1:], self.dtype, self.xp)
        self._pending = [self._coalesced(self._pending)]
        return self._pending[0]

    def set_sparse_diff(self, grad):
        """Make ``grad`` (a SparseGradient) the whole gradient."""
        if not self._diff_zero:
            self._pending = []
            self._diff[...] = 0
            self._diff_zero = True
        self._pending = [grad]

    def clear_diff(self, written=False):
        """diff = 0 (and no pending rows); ``written``: the caller has written the zeros into the diff array already
        (Net.clear_param_diffs, all of a net's at once on the kernel threads)."""
        self._pending = []
        if not written:
            self._diff[...] = 0
        self._diff_zero, self._zeros_due = True, False

    def defer_clear_diff(self):
        """diff = 0 as :meth:`clear_diff`, but the zeros are written only when the diff is next read, unless
        :meth:`diff_to_overwrite` first hands the array to a writer of every value: a fully connected layer's
        weight gradient (Net.clear_param_diffs) then costs no pass of zeros and no read of them (AlexNet's fc6:
        151 MB each, VGG-16's 411 MB, per iteration and replica)."""
        self._pending = []
        self._diff_zero = self._zeros_due = True

    def diff_to_overwrite(self):
        """``(array, overwrite)``: the diff array and True where the gradient is zero but the array not yet written
        (:meth:`defer_clear_diff`): the caller must then write every value of it (a beta = 0 GEMM); else False,
        and the caller adds into it."""
        if self._zeros_due and not self._pending:
            self._zeros_due = self._diff_zero = False
            return self._diff, True
        return self.diff, False

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
        Returns None, as Caffe's Blob.reshape does.
        """
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        if shape == self.data.shape:
            return
        size = int(numpy.prod(shape, dtype=numpy.int64))
        if size == self.data.size:
            self._flush()
            self._data = self.data.reshape(shape)
            self._diff = self._diff.reshape(shape)
        else:
            self._pending, self._diff_zero, self._zeros_due = [], True, False
            self._data = self._diff = None  # the old arrays are freed before the new ones count against memory
            self._data = zeros_checked(shape, self.dtype, self.xp)
            self._diff = zeros_checked(shape, self.dtype, self.xp, "the gradient of a blob")

    def cast(self, dtype):
        """Give data and diff the dtype ``dtype`` (their values converted); nothing to do when they have it."""
        dtype = numpy.dtype(dtype)
        if dtype != self.dtype:
            self.dtype = dtype
            self.data, self.diff = self._data.astype(dtype), self.diff.astype(dtype)

    def share_data(self, other):
        """Use ``other``'s data array (same storage), as Caffe's ShareData does for in-place views."""
        self.data = other.data

    def __repr__(self):
        return f"Blob(shape={self.shape}, dtype={self.dtype})"
