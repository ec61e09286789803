"""float32 products whose every element is OpenBLAS's blocked FMA chain, for the shapes OpenBLAS computes otherwise.

OpenBLAS's large-product SGEMM (its SkylakeX core, that of this project's AVX-512 machines; not its Haswell core, whose
edge tiles sum in two chains) computes each element ``c[i, j]`` the same way whatever the matrix sizes, the element's
place or the thread count: the summed axis is cut
into blocks (:func:`k_blocks`: 448 long; a remainder between 448 and 896 split in two halves: rounded up to 16 where
OpenBLAS runs the product on one thread, ``(rest + 1) // 2`` where on several: level3.c and level3_thread.c), each
block is one FMA chain ``acc = a[i, k] * b[k, j] + acc`` from zero in the order of k, and the blocks' sums are added
in order. Only where OpenBLAS leaves that path does an element's value depend on the shape: products of at most
:data:`SMALL_MNK` multiply-adds go to its small-matrix kernel, and a product with one row or one column to GEMV
(:func:`is_thin`). :func:`matmul` computes such products with that same per-element arithmetic (numba, FMA
contraction only, no reassociation), so that with kernels/blas.py routing them here every float32 product gives each
element the same bits in any batch (blas.batch_invariant); with another BLAS, blas routes every float32 product here.

Two layouts run without a copy (kernels/_thin_jit.py: FMA chains in zmm registers): ``b`` C-contiguous (K, N) (a
convolution's columns; 64 columns at a time) and ``b`` the transpose of a C-contiguous (N, K) (InnerProduct's
``x @ W.T``; 16 rows of W at a time, transposed in registers); the columns after the last whole group of 16 from a
copy padded with zeros.
The columns are split between the kernel threads (kernels/threadpool.py): each element is computed alone, so the
bits do not depend on the split either.
"""
import functools
import math
import threading

import numpy

from .threadpool import num_threads, product_jit, run_jobs

BLOCK_K, UNROLL = 448, 16  # OpenBLAS's SGEMM_DEFAULT_Q and SGEMM_DEFAULT_UNROLL_M on SkylakeX
_FLOAT32 = numpy.dtype(numpy.float32)
SMALL_MNK = 100 ** 3  # OpenBLAS's small-matrix kernel takes products of at most this many multiply-adds
# multiply-adds from which a product is shared between the kernel threads (threadpool.run_jobs: a product thread
# takes a job in about a microsecond, and making the jobs in one compiled call and sharing them costs 5-10 us on this
# project's 2-core machine): 0.5M in the kernels that take four rows of a at a time (LeNet's first convolution at
# batch 1, 0.29M: 9 us on one thread, 12 shared; at batch 10, ten products of 0.29M: 104 and 71), 0.25M in those that
# take fewer (LeNet's ip1 at batch 1, 0.4M: 61 and 25). bench_batch_invariance.py --split measures them
PARALLEL_MULTIPLY_ADDS, PARALLEL_MULTIPLY_ADDS_FEW_ROWS = 1 << 19, 1 << 18


def k_blocks(k, threaded):
    """The ``(start, stop)`` of each block of a summed axis of length ``k``, as OpenBLAS's level-3 driver cuts it
    (``threaded``: the driver of a product split between threads)."""
    blocks, start = [], 0
    while start < k:
        rest = k - start
        if rest >= 2 * BLOCK_K or rest <= BLOCK_K:
            size = min(rest, BLOCK_K)
        else:
            size = (rest + 1) // 2 if threaded else ((rest // 2 + UNROLL - 1) // UNROLL) * UNROLL
        blocks.append((start, start + size))
        start += size
    return blocks


def is_thin(m, n, k):
    """Whether OpenBLAS would compute an (m, k) x (k, n) product off its large-product path (GEMV or small kernel)."""
    return m == 1 or n == 1 or m * n * k <= SMALL_MNK


_lock = threading.Lock()
_jit = []


def _kernels():
    """kernels/_thin_jit.py (imported, and its loops compiled or loaded from numba's cache, at the first product)."""
    if not _jit:
        with _lock:
            from . import _thin_jit
            _jit[:] = [_thin_jit]
    return _jit[0]


@functools.lru_cache(maxsize=256)
def _blocks(k, threaded):
    return numpy.array(k_blocks(k, threaded), numpy.int64)


def _matrix(a, b, c, threaded):
    # one (M, K) x (K, N) float32 product into the C-contiguous c, on the kernel threads
    m, k = a.shape
    n = b.shape[1]
    if k == 0:
        c[...] = 0
        return
    if n * (k + m) < m * k and not a.flags.c_contiguous and a.flags.f_contiguous and b.flags.c_contiguous:
        # a transposed (a convolution's data gradient W^T gy) and larger than b and c together: c^T = b^T a^T reads a
        # as it lies, where a copy of it would take as long as a narrow product (a 7 x 7 layer's: 49 columns), and
        # makes its rows the strips of 64 columns. Each element is the same chain over k of the same products, so the
        # same bits
        transposed_c = numpy.empty((n, m), numpy.float32)
        _matrix(numpy.ascontiguousarray(b.T), a.T, transposed_c, threaded)
        c[...] = transposed_c.T
        return
    a = a if a.flags.c_contiguous else numpy.ascontiguousarray(a)
    blocks = _blocks(k, threaded)
    flags = b.flags
    transposed = flags.f_contiguous and not flags.c_contiguous
    b = b.T if transposed else b if flags.c_contiguous else numpy.ascontiguousarray(b)
    jit = _jit[0] if _jit else _kernels()
    work = m * n * k
    if not _shared(m, work, jit):  # one thread: one compiled call (LeNet's products take microseconds)
        jit.matrix(a, b, c, blocks, transposed)
        return
    stream = not transposed and m < jit.ROWS  # one row or a few: b read as it lies, STREAM columns a pass
    # a thread's columns come in multiples of the kernels' widths: 256 for stream, 16 rows of bt, 64 (then 16) of b
    unit, stop = (256, n) if stream else (16, n) if transposed else (64, n // 16 * 16)
    if stop:
        pj = product_jit()
        run_jobs(pj.matrix_jobs(pj.STREAM if stream else pj.GEMM, a, b, c, blocks, transposed, unit, stop,
                                num_threads()))
    if stop < n:  # the last columns, through a copy padded with zeros to 16
        padded = numpy.zeros((k, 16), numpy.float32)
        padded[:, :n - stop] = b[:, stop:]
        part = numpy.empty((m, 16), numpy.float32)
        jit.gemm(a, padded, part, blocks, 0, 16, False, 16)
        c[:, stop:] = part[:, :n - stop]


def _shared(rows, work, jit):
    # whether a product of `rows` rows of a and `work` multiply-adds is worth sharing between the kernel threads
    return work >= (PARALLEL_MULTIPLY_ADDS if rows >= jit.ROWS else PARALLEL_MULTIPLY_ADDS_FEW_ROWS)


def matmul(a, b, out=None, threaded=True):
    """``a @ b`` of float32 arrays (numpy's matmul rules for 2-D and batched operands) with every element computed
    as OpenBLAS's large-product SGEMM computes it (see above; ``threaded``: as it does on several threads); into
    ``out`` when given."""
    # the common cases first, with as few checks as they need (LeNet's products at batch 1 take microseconds): a
    # convolution's product of one image and one group, (1, M, K) x (1, K, N) (or behind more axes of one: its data
    # gradient, (1, K, M) x (1, 1, M, N)); InnerProduct's, 2-D
    x, y, into = a, b, out
    if out is not None and a.ndim > 2 and b.ndim > 2 and out.ndim > 2 and math.prod(a.shape[:-2]) == 1 and \
            math.prod(b.shape[:-2]) == 1 and math.prod(out.shape[:-2]) == 1:
        x, y, into = a.reshape(a.shape[-2:]), b.reshape(b.shape[-2:]), out.reshape(out.shape[-2:])  # views
    if x.ndim == 2 and y.ndim == 2 and x.dtype is _FLOAT32 and y.dtype is _FLOAT32 and x.shape[1] == y.shape[0]:
        shape = (x.shape[0], y.shape[1])
        if into is not None and into.shape == shape and into.dtype is _FLOAT32 and into.flags.c_contiguous:
            _matrix(x, y, into, threaded)
            return out
        c = numpy.empty(shape, numpy.float32)
        _matrix(x, y, c, threaded)
        if out is None:
            return c
        into[...] = c  # an out of another layout or dtype
        return out
    if into is not None and b.ndim >= 3 and into.ndim == b.ndim and a.size == x.shape[-2] * x.shape[-1] and \
            x.dtype is _FLOAT32 and y.dtype is _FLOAT32 and into.dtype is _FLOAT32 and into.flags.c_contiguous and \
            b.flags.c_contiguous and x.shape[-1] == y.shape[-2] and into.shape[:-2] == b.shape[:-2] and \
            into.shape[-2:] == (x.shape[-2], y.shape[-1]) and \
            into.shape[-2] * into.shape[-1] * x.shape[-1] <= SMALL_MNK:
        # one matrix times a stack of small ones (a convolution's weights and its images' columns): one compiled call
        # makes the jobs, a's matrix shared by all (LeNet's first convolution at batch 10: ten products of 9 us)
        _small_stack(a.reshape(x.shape[-2:]), b.reshape((-1,) + b.shape[-2:]), into.reshape((-1,) + into.shape[-2:]),
                     threaded)
        return out
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"thin_gemm.matmul takes matrices, got {a.shape} and {b.shape}")
    if math.prod(a.shape[:-2]) == 1 and math.prod(b.shape[:-2]) == 1:
        # one matrix each, whatever the axes of one in front (a convolution's product of one image and one group)
        batch = (1,) * (max(a.ndim, b.ndim) - 2)
        a, b = a.reshape(a.shape[-2:]), b.reshape(b.shape[-2:])
    else:
        batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if a.ndim == 2 and b.ndim == 2 and a.dtype == b.dtype == numpy.float32 and a.shape[1] == b.shape[0]:
        shape = batch + (a.shape[0], b.shape[1])
        c = out if out is not None and out.shape == shape and out.flags.c_contiguous and out.dtype == a.dtype \
            else numpy.empty(shape, numpy.float32)
        _matrix(a, b, c.reshape(shape[-2:]), threaded)
        return _done(c, out)
    shape = tuple(batch) + (a.shape[-2], b.shape[-1])
    if a.shape[-1] != b.shape[-2] or (out is not None and out.shape != shape):
        raise ValueError(f"matmul: shapes {a.shape}, {b.shape} and out {None if out is None else out.shape}")
    c = out if out is not None and out.flags.c_contiguous and out.dtype == numpy.float32 else numpy.empty(
        shape, numpy.float32)
    count = math.prod(batch)
    m, k, n = shape[-2], a.shape[-1], shape[-1]
    a, b = a.astype(numpy.float32, copy=False), b.astype(numpy.float32, copy=False)
    flat = c.reshape((count, m, n))
    if 0 < k and m * n * k <= SMALL_MNK and _rows_contiguous(b):
        # small products (one per image): one compiled call for all of them, a's matrix made contiguous once
        a = a if _rows_contiguous(a) else numpy.ascontiguousarray(a)
        a = numpy.broadcast_to(a, tuple(batch) + a.shape[-2:]).reshape((count, m, k))
        b = numpy.broadcast_to(b, tuple(batch) + b.shape[-2:]).reshape((count, k, n))
        blocks, jit = _blocks(k, threaded), _jit[0] if _jit else _kernels()
        if not _shared(m, count * m * n * k, jit):
            jit.batch(a, b, flat, blocks, 0, count)
            return _done(c, out)
        run_jobs(product_jit().stack_jobs(a, b, flat, blocks, min(num_threads(), count)))
        return _done(c, out)
    a = numpy.broadcast_to(a, tuple(batch) + a.shape[-2:]).reshape((count,) + a.shape[-2:])
    b = numpy.broadcast_to(b, tuple(batch) + b.shape[-2:]).reshape((count,) + b.shape[-2:])
    for i in range(count):
        _matrix(a[i], b[i], flat[i], threaded)
    return _done(c, out)


def _small_stack(a, b, c, threaded):
    # c[i] = a @ b[i]: a (M, K), b (count, K, N) and c (count, M, N) C-contiguous, each product at most SMALL_MNK
    m, k = a.shape
    count, n = b.shape[0], b.shape[2]
    if k == 0:
        c[...] = 0
        return
    a = a if _rows_contiguous(a) else numpy.ascontiguousarray(a)
    jit = _jit[0] if _jit else _kernels()
    pieces = min(num_threads(), count) if _shared(m, count * m * n * k, jit) else 1
    run_jobs(product_jit().stack_jobs(a, b, c, _blocks(k, threaded), pieces))


def _rows_contiguous(x):
    # each matrix of x (its last two axes) C-contiguous, as the compiled loops index it
    return x.strides[-1] == x.itemsize and (x.shape[-2] <= 1 or x.strides[-2] == x.itemsize * x.shape[-1])


def _done(c, out):
    if out is not None and c is not out:
        out[...] = c
        return out
    return c
