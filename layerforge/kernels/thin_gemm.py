"""float32 products whose every element is OpenBLAS's blocked FMA chain, for the shapes OpenBLAS computes otherwise.

OpenBLAS's large-product SGEMM (the SkylakeX / Haswell cores of this project's machines) computes each element
``c[i, j]`` the same way whatever the matrix sizes, the element's place or the thread count: the summed axis is cut
into blocks (:func:`k_blocks`: 448 long; a remainder between 448 and 896 split in two halves: rounded up to 16 where
OpenBLAS runs the product on one thread, ``(rest + 1) // 2`` where on several: level3.c and level3_thread.c), each
block is one FMA chain ``acc = a[i, k] * b[k, j] + acc`` from zero in the order of k, and the blocks' sums are added
in order. Only where OpenBLAS leaves that path does an element's value depend on the shape: products of at most
:data:`SMALL_MNK` multiply-adds go to its small-matrix kernel, and a product with one row or one column to GEMV
(:func:`is_thin`). :func:`matmul` computes such products with that same per-element arithmetic (numba, FMA
contraction only, no reassociation), so that with kernels/blas.py routing them here every float32 product gives each
element the same bits in any batch (blas.batch_invariant).

Two layouts run without a copy: ``b`` C-contiguous (K, N) (a convolution's columns; vectorised across 16 columns)
and ``b`` the transpose of a C-contiguous (N, K) (InnerProduct's ``x @ W.T``; 8 rows of W at a time). The
columns are split between the kernel threads (kernels/threadpool.py): each element is computed alone, so the bits
do not depend on the split either.
"""
import math

import numpy

from .threadpool import cpu_kernel, parallel_for

BLOCK_K, UNROLL = 448, 16  # OpenBLAS's SGEMM_DEFAULT_Q and SGEMM_DEFAULT_UNROLL_M on SkylakeX
SMALL_MNK = 100 ** 3  # OpenBLAS's small-matrix kernel takes products of at most this many multiply-adds


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


@cpu_kernel(fastmath=("contract",))
def _nn(a, b, c, blocks, j0, j1):  # pragma: no cover - compiled
    # c[i, j0:j1] = a[i] @ b[:, j0:j1]: a (M, K), b (K, N), c (M, N) C-contiguous; 16 columns at a time
    m = a.shape[0]
    acc = numpy.empty(16, numpy.float32)
    total = numpy.empty(16, numpy.float32)
    for i in range(m):
        for jb in range(j0, j1, 16):
            width = min(16, j1 - jb)
            for q in range(blocks.shape[0]):
                for t in range(16):
                    acc[t] = 0
                if width == 16:
                    for kk in range(blocks[q, 0], blocks[q, 1]):
                        x = a[i, kk]
                        for t in range(16):
                            acc[t] = x * b[kk, jb + t] + acc[t]
                else:
                    for kk in range(blocks[q, 0], blocks[q, 1]):
                        x = a[i, kk]
                        for t in range(width):
                            acc[t] = x * b[kk, jb + t] + acc[t]
                for t in range(16):
                    total[t] = acc[t] if q == 0 else total[t] + acc[t]
            for t in range(width):
                c[i, jb + t] = total[t]


@cpu_kernel(fastmath=("contract",))
def _nt(a, bt, c, blocks, j0, j1):  # pragma: no cover - compiled
    # c[i, j0:j1] = a[i] @ bt[j0:j1].T: a (M, K), bt (N, K), c (M, N) C-contiguous; 8 rows of bt at a time
    m = a.shape[0]
    acc = numpy.empty(8, numpy.float32)
    total = numpy.empty(8, numpy.float32)
    for i in range(m):
        for jb in range(j0, j1, 8):
            width = min(8, j1 - jb)
            for q in range(blocks.shape[0]):
                if width == 8:
                    for t in range(8):
                        acc[t] = 0
                    for kk in range(blocks[q, 0], blocks[q, 1]):
                        x = a[i, kk]
                        for t in range(8):
                            acc[t] = x * bt[jb + t, kk] + acc[t]
                else:
                    for t in range(width):
                        s = numpy.float32(0)
                        for kk in range(blocks[q, 0], blocks[q, 1]):
                            s = a[i, kk] * bt[jb + t, kk] + s
                        acc[t] = s
                for t in range(8):
                    total[t] = acc[t] if q == 0 else total[t] + acc[t]
            for t in range(width):
                c[i, jb + t] = total[t]


def _matrix(a, b, c, threaded):
    # one (M, K) x (K, N) float32 product into the C-contiguous c, on the kernel threads
    m, k = a.shape
    n = b.shape[1]
    if k == 0:
        c[...] = 0
        return
    a = numpy.ascontiguousarray(a)
    blocks = numpy.array(k_blocks(k, threaded), numpy.int64)
    if b.T.flags.c_contiguous and not b.flags.c_contiguous:
        kernel, b, unit = _nt, b.T, 8
    else:
        kernel, b, unit = _nn, numpy.ascontiguousarray(b), 16
    pieces = math.ceil(n / unit)

    def body(lo, hi):
        kernel(a, b, c, blocks, lo * unit, min(hi * unit, n))
    parallel_for(pieces, body, work=m * n * k // 8)


def matmul(a, b, out=None, threaded=True):
    """``a @ b`` of float32 arrays (numpy's matmul rules for 2-D and batched operands) with every element computed
    as OpenBLAS's large-product SGEMM computes it (see above; ``threaded``: as it does on several threads); into
    ``out`` when given."""
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"thin_gemm.matmul takes matrices, got {a.shape} and {b.shape}")
    batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    shape = tuple(batch) + (a.shape[-2], b.shape[-1])
    if a.shape[-1] != b.shape[-2] or (out is not None and out.shape != shape):
        raise ValueError(f"matmul: shapes {a.shape}, {b.shape} and out {None if out is None else out.shape}")
    c = out if out is not None and out.flags.c_contiguous and out.dtype == numpy.float32 else numpy.empty(
        shape, numpy.float32)
    count = math.prod(batch)
    a = numpy.broadcast_to(a, tuple(batch) + a.shape[-2:]).reshape((count,) + a.shape[-2:])
    b = numpy.broadcast_to(b, tuple(batch) + b.shape[-2:]).reshape((count,) + b.shape[-2:])
    flat = c.reshape((count,) + shape[-2:])
    for i in range(flat.shape[0]):
        _matrix(a[i].astype(numpy.float32, copy=False), b[i].astype(numpy.float32, copy=False), flat[i],
                threaded)
    if out is not None and c is not out:
        out[...] = c
        return out
    return c
