"""``c += a @ b`` without a temporary the size of c, where the BLAS can accumulate in place (beta = 1).

A fully connected layer's weight gradient is as large as its weights (AlexNet's fc6: 151 MB):
``diff += gy.T @ x`` allocates that much, faults it in and adds it in a second pass. SciPy's BLAS
wrappers (present with numpy on most installs, not a requirement) take beta = 1 and write into c;
without them, or for cupy arrays, the plain expression runs. So does any c under ``MIN_BYTES``: SciPy
links its own OpenBLAS with its own thread pool, and two pools on two cores cost more than a small
temporary (LeNet's ip1 backward went from 1 to 9 ms with both pools at 2 threads).
"""
import numpy

try:
    from scipy.linalg import blas as _blas
except ImportError:  # pragma: no cover - scipy is optional
    _blas = None

MIN_BYTES = 32 << 20


def _fortran_operand(x):
    # (array to pass, transpose flag) so that the BLAS sees x without copying it
    if x.flags.f_contiguous:
        return x, 0
    if x.flags.c_contiguous:
        return x.T, 1
    return numpy.asfortranarray(x), 0


def add_matmul(c, a, b):
    """``c += a @ b`` for 2-D arrays of one float dtype (c C-contiguous)."""
    gemm = None
    if _blas is not None and c.nbytes >= MIN_BYTES and c.flags.c_contiguous and \
            all(isinstance(t, numpy.ndarray) for t in (a, b, c)):
        gemm = {numpy.dtype(numpy.float32): _blas.sgemm, numpy.dtype(numpy.float64): _blas.dgemm}.get(c.dtype)
    if gemm is None or a.dtype != c.dtype or b.dtype != c.dtype:
        c += a @ b
        return c
    # c (m, n) in C order is c.T (n, m) in Fortran order, and c.T += b.T @ a.T
    p, ta = _fortran_operand(b.T)
    q, tb = _fortran_operand(a.T)
    out = gemm(1.0, p, q, beta=1.0, c=c.T, trans_a=ta, trans_b=tb, overwrite_c=1)
    if not numpy.shares_memory(out, c):
        c[...] = out.T
    return c
