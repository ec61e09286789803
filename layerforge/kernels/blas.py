"""Every matrix product of the layers and engines: :func:`matmul` and :func:`add_matmul`, under one precision switch.

Precision (float32 operands only; float64 is always exact float64): :func:`set_gemm_precision` or the
environment variable ``LAYERFORGE_GEMM_PRECISION`` (read at the first product):

- ``fp32`` (default): strict fp32 (cuBLAS's pedantic compute type on a GPU);
- ``tf32``: on a GPU, cuBLAS may round the operands to TF32 (10-bit mantissa) for tensor cores; fp32
  accumulation. On numpy it is fp32.
- ``fp16`` / ``bf16``: the operands are rounded to half / bfloat16 (round to nearest even) and the
  products accumulated in fp32; results and storage stay fp32. On a GPU this is cuBLAS's
  ``CUBLAS_COMPUTE_32F_FAST_16F`` / ``_FAST_16BF`` (which may also choose TF32, never less than the
  16-bit format); on numpy the rounding is done here, so a CPU run shows the same numerics. On a CPU with
  AVX512_BF16, bf16 products of float32 matrices run on bfloat16 operands in kernels/bf16_gemm.py (VDPBF16PS,
  up to twice the fp32 rate: the same rounded operands and fp32 sums, in another order, denormals flushed);
  elsewhere the rounded operands go to the fp32 GEMM.

On a GPU every product goes to cuBLAS's ``gemmStridedBatchedEx`` through ``kernels/cuda/gemm.py``: cupy's
own batched matmul ignores its compute-type setting, so strict fp32 and TF32 hold for the batched
products of the convolution engines only through this path.

``add_matmul``: ``c += a @ b`` without a temporary the size of c, where the BLAS can accumulate in place
(beta = 1). A fully connected layer's weight gradient is as large as its weights (AlexNet's fc6: 151 MB):
``diff += gy.T @ x`` allocates that much, faults it in and adds it in a second pass. SciPy's BLAS
wrappers (present with numpy on most installs, not a requirement) take beta = 1 and write into c;
without them, or for cupy arrays, the plain expression runs. So does any c under ``MIN_BYTES``: SciPy
links its own OpenBLAS with its own thread pool, and two pools on two cores cost more than a small
temporary (LeNet's ip1 backward went from 1 to 9 ms with both pools at 2 threads).

Batch invariance (on by default; :func:`set_batch_invariant` or ``LAYERFORGE_BATCH_INVARIANT=0`` turns it off): one
sample's results do not depend on the batch it is in, bit for bit. OpenBLAS's large-product SGEMM computes each
element as one blocked FMA chain whatever the matrix sizes (kernels/thin_gemm.py); only its small-matrix kernel and
GEMV, which it takes for small or one-row products, compute otherwise. Under the switch, where the installed BLAS
passes :func:`canonical_blas`'s check, :func:`matmul` sends those products, and those with few rows, to thin_gemm,
which computes them with the large path's arithmetic: every float32 product then gives an element the same bits
whatever the other rows and columns, so InnerProduct and every convolution engine on the CPU are invariant (IM2COL
and IMPLICIT agree bit for bit; each Winograd engine has its own sums, so autotune.ConvEngines chooses a
convolution's forward arithmetic once per per-image problem, for every batch). Every BLAS call under the switch runs
on one OpenBLAS thread (:func:`one_blas_thread`; a Net holds it for each pass), so the summed axis is always cut as
one thread cuts it, and the large products split themselves over the kernel threads (:func:`_large_product`: pieces
that threadpool.run_jobs hands to product threads waiting in compiled code), which then have the cores to themselves.
With another BLAS (OpenBLAS's Haswell and Zen cores of AVX2 machines, whose micro-kernels sum some elements in two
chains by the element's place in a tile; MKL) thin_gemm computes every float32 product, with the same arithmetic
(docs/performance.md, "Batch-invariant results"); a weight gradient, a sum over the batch, still goes to the BLAS.
"""
import functools
import math
import os
import threading

import numpy

from ..backend import get_array_module
from . import bf16_gemm, thin_gemm
from .threadpool import MIN_PARALLEL_ELEMENTS, num_threads, parallel_for, product_jit, run_jobs, within_parallel_for

@functools.cache
def _scipy_blas():
    """scipy's BLAS wrappers (None without scipy), imported on the first large product: the import costs about
    0.14 s, which every command and every rank would pay at start-up for products most runs never make."""
    try:
        from scipy.linalg import blas
    except ImportError:  # pragma: no cover - scipy is optional
        return None
    return blas

MIN_BYTES = 32 << 20


def add_matmul_nt(c, a, b):
    """``c += a @ b^T`` (b given untransposed: the last two axes swapped), batched as :func:`add_matmul`: a
    convolution's filter gradient ``gW += gy col^T`` (gy (..., Cout, P), col (..., K, P)).

    On numpy the product is formed as ``(b @ a^T)^T`` where ``b`` has more rows than ``a`` and the summed axis
    is at least twice as long: OpenBLAS's kernels run such a product (both operands' inner axis contiguous)
    15-40% faster with the longer side first on this project's AVX-512 machine (ResNet-50's 3x3 filter gradients,
    K = 9 Cin >= Cout: 156 -> 217 GFLOP/s), and slower the other way (a 1x1 filter that widens 64 -> 256
    channels); the transposed add of the (K, Cout) result costs more than that saves where the summed axis is
    short (14 x 14 images). Both orders sum the same products; only the rounding of the sums over P may differ.
    The product goes into a temporary laid out (K, Cout): a GEMM into ``c^T``, a view of ``c``, runs in the order
    ``c`` lies in memory, the slow one (one thread, ResNet-50's 64 x 256 filter gradient of 56 x 56 images:
    71-76 GFLOP/s into the view, 86-90 through the temporary; docs/performance.md).
    """
    rows, summed = b.shape[-2], b.shape[-1]
    if get_array_module(c, a, b) is numpy and a.shape[-2] < rows and summed >= 2 * rows:
        # through add_matmul, so the precision switch and the large path's threads apply alike
        product = numpy.empty(numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (rows, a.shape[-2]), c.dtype)
        add_matmul(product, b, a.swapaxes(-1, -2), overwrite=True)
        c += product.swapaxes(-1, -2)
        return c
    return add_matmul(c, a, b.swapaxes(-1, -2))


def _fortran_operand(x):
    # (array to pass, transpose flag) so that the BLAS sees x without copying it
    if x.flags.f_contiguous:
        return x, 0
    if x.flags.c_contiguous:
        return x.T, 1
    return numpy.asfortranarray(x), 0


GEMM_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
_PRECISION = {"gemm": None}


def set_gemm_precision(name):
    """Make every later float32 product of this process use ``name`` (one of :data:`GEMM_PRECISIONS`)."""
    if name not in GEMM_PRECISIONS:
        from ..errors import LayerforgeError
        raise LayerforgeError(f"GEMM precision {name!r}: use one of {', '.join(GEMM_PRECISIONS)}")
    _PRECISION["gemm"] = name


def gemm_precision():
    """The precision of float32 products now (``LAYERFORGE_GEMM_PRECISION`` until set, default ``fp32``)."""
    if _PRECISION["gemm"] is None:
        set_gemm_precision(os.environ.get("LAYERFORGE_GEMM_PRECISION", "fp32") or "fp32")
    return _PRECISION["gemm"]


_BATCH_INVARIANT = {"on": None}


def set_batch_invariant(flag):
    """Make (True) or stop making (False) every later product of the layers batch-invariant (see above)."""
    _BATCH_INVARIANT["on"] = bool(flag)


def batch_invariant():
    """Whether results must not depend on the batch (``LAYERFORGE_BATCH_INVARIANT`` until set, default on: its cost is
    within 5% of the plain products' on LeNet, AlexNet, ResNet-50 and VGG-16 at batch 1, 10 and 64, docs/performance.md
    "Batch-invariant results")."""
    if _BATCH_INVARIANT["on"] is None:
        set_batch_invariant(os.environ.get("LAYERFORGE_BATCH_INVARIANT", "1").strip().lower() not in ("", "0", "false"))
    return _BATCH_INVARIANT["on"]


def matmul_rows(a, b, out):
    """``out = a @ b`` for a (m, k), b (k, n) whose rows are samples (an InnerProduct's ``x W^T``). A float32 host
    product of at least :data:`SWAP_MIN_ROWS` rows by a transposed array runs as ``(b^T a^T)^T``, the weights the
    left operand (of OpenBLAS's large path, or of thin_gemm, which then reads them once rather than once for every
    four rows): under :func:`batch_invariant` every element is the same FMA chain either way, so the same bits, a
    row's own in any batch."""
    if type(a) is numpy.ndarray and type(b) is numpy.ndarray and a.dtype is _FLOAT32 and b.dtype is _FLOAT32 and \
            a.ndim == 2 and a.shape[0] >= SWAP_MIN_ROWS and b.T.flags.c_contiguous and gemm_precision() == "fp32":
        out[...] = matmul(b.T, a.T).T
        return out
    return matmul(a, b, out=out)


# OpenBLAS's large path streams a big row-major left operand faster than the same array transposed on the right, and
# than thin_gemm from about 10 rows on the other side: (b^T a^T)^T took 0.5-0.7x the time of a @ b (AlexNet's fc6 at
# batch 16: 12.9 against 19.0 ms, fc7 4.9 / 8.3, fc8 1.0 / 2.2; fc6 at 32 rows 14.9 / 22.4, at 128 38 / 57), 1.1-2.5x
# at 4-8 rows (VGG-16's fc6 at batch 4: 27 against 11; thin_gemm's there)
SWAP_MIN_ROWS = 12

_CANONICAL = {"checked": None, "control": None}


def _openblas_control():
    """``(get, set, sgemm, sgemm's address, ilp64)``: numpy's OpenBLAS's thread count (ctypes calls of 0.1 us, looked
    up once through threadpoolctl), its cblas_sgemm (None without one) and whether it takes 64-bit integers; or False:
    another BLAS, an OpenBLAS threaded by OpenMP (whose count is each thread's own), no threadpoolctl."""
    if _CANONICAL["control"] is None:
        _CANONICAL["control"] = False
        try:
            import ctypes

            from threadpoolctl import ThreadpoolController

            for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
                getter = getattr(lib, "_get_symbol", None)
                if "numpy" in lib.filepath and getter is not None and lib.internal_api == "openblas" and \
                        getattr(lib, "threading_layer", "") != "openmp":
                    get, put = getter("openblas_get_num_threads"), getter("openblas_set_num_threads")
                    if get is not None and put is not None:
                        ilp64 = "64" in lib._symbol_suffix
                        sgemm = _cblas_sgemm(getter("cblas_sgemm"), ilp64)
                        address = ctypes.cast(sgemm, ctypes.c_void_p).value if sgemm is not None else 0
                        _CANONICAL["control"] = (get, put, sgemm, address, ilp64)
        except Exception:  # noqa: BLE001 - threadpoolctl missing or unable to read the library
            pass
    return _CANONICAL["control"]


def _cblas_sgemm(function, ilp64):
    # OpenBLAS's cblas_sgemm with its argument types (integers of 64 bits in an ILP64 build), or None
    if function is None:
        return None
    import ctypes

    index, pointer = (ctypes.c_int64 if ilp64 else ctypes.c_int), ctypes.c_void_p
    function.argtypes = [ctypes.c_int] * 3 + [index] * 3 + [ctypes.c_float, pointer, index, pointer, index,
                                                         ctypes.c_float, pointer, index]
    function.restype = None
    return function


def _sgemm_accumulate(a, b, c):
    """``c += a @ b`` for 2-D float32 arrays by OpenBLAS's cblas_sgemm (beta 1: in place, no temporary) on the
    calling thread; False where this BLAS has none or an array is not laid out as a BLAS matrix."""
    jobs = _sgemm_jobs(a[None], b[None], c[None], True, 1, "matrices", invariant=False)
    if jobs is None:
        return False
    product_jit().execute(jobs[0])
    return True


_AXES = {"matrices": 0, "rows": 1, "columns": 2}


def _sgemm_jobs(a, b, out, accumulate, pieces, axis, invariant=True):
    """kernels/_product_jit.py's SGEMM jobs for ``out (+)= a @ b`` of (count, rows, columns) float32 stacks, cut into
    ``pieces`` along ``axis`` ("matrices"; "rows" or "columns" of one matrix: _product_jit.sgemm_jobs); None where
    this BLAS has no cblas_sgemm, an array is not laid out as a BLAS matrix, or (``invariant``) a piece is one
    OpenBLAS computes off its large path (thin_gemm's shapes)."""
    control = _openblas_control()
    if not control or control[2] is None:
        return None
    jobs = product_jit().sgemm_jobs(a, b, out, accumulate, control[3], control[4], pieces, _AXES[axis],
                                    thin_gemm.SMALL_MNK if invariant else 0)
    return jobs if len(jobs) else None


class _OneBlasThread:
    """The context of :func:`one_blas_thread`: one count of the contexts open in all threads, under a lock; the
    outermost sets OpenBLAS's thread count to one and the last to leave puts it back."""

    def __init__(self):
        self.depth, self.saved, self.lock = 0, None, threading.Lock()

    @property
    def available(self):
        """Whether this BLAS's thread count can be set (else the context changes nothing)."""
        return bool(_openblas_control())

    def __enter__(self):
        with self.lock:
            if self.depth == 0:
                control = _openblas_control()
                if control:
                    num_threads()  # the kernel threads follow the BLAS's count: read it before it is lowered
                    self.saved = control[0]()
                    if self.saved != 1:
                        control[1](1)
            self.depth += 1
        return self

    def __exit__(self, *exc):
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.saved is not None:
                if self.saved != 1:
                    _openblas_control()[1](self.saved)
                self.saved = None


_ONE_BLAS_THREAD = _OneBlasThread()


def one_blas_thread():
    """A context in which numpy's OpenBLAS computes every product on the thread that calls it, as kernel threads
    that share out products themselves need: the products of Winograd's tile positions, and every product under
    :func:`batch_invariant` (:func:`matmul` splits a large one over the kernel threads). OpenBLAS's own threads spin
    for about 0.1 s after each product they share (``OPENBLAS_THREAD_TIMEOUT``: 2^28 cycles) on the cores the kernel
    threads then need: AlexNet's fc6 at batch 1, one row, took 9.1 ms on the two kernel threads after a product
    OpenBLAS shared and 4.2 ms (OpenBLAS's GEMV: 4.5) after none (benchmarks/bench_batch_invariance.py --products).
    Contexts nest and may be open in several threads at once; OpenBLAS's count is put back when the last closes."""
    return _ONE_BLAS_THREAD


def row_sums(a):
    """The sums of the rows of the 2-D ``a`` (m, n) as an (m,) array: a GEMV against ones (a sum over the last axis of
    a large array is a slow reduction in numpy; bias and scale gradients). On numpy the GEMV runs on the calling
    thread (:func:`one_blas_thread`): shared by OpenBLAS's threads, it left them spinning on the cores that the
    kernel threads' products then took (AlexNet's conv2 backward at batch 16, 2 threads: 107 ms after the bias
    gradient's shared GEMV, 75 after one on the calling thread)."""
    xp = get_array_module(a)
    ones = xp.ones(a.shape[-1], dtype=a.dtype)
    if xp is not numpy:
        return a @ ones
    with one_blas_thread():
        return a @ ones


def canonical_blas():
    """Whether numpy's BLAS computes large float32 products as thin_gemm does (checked once, bit for bit, on
    products of summed lengths that exercise every block rule, plain and with a transposed operand, on one BLAS
    thread as :func:`matmul` runs them under :func:`batch_invariant`)."""
    if _CANONICAL["checked"] is None:
        rs = numpy.random.RandomState(7)
        ok = bool(_openblas_control())
        with one_blas_thread():
            for m, n, k in ((64, 70, 600), (9, 300, 1000), (40, 130, 2001)):
                a, b = rs.randn(m, k).astype(numpy.float32), rs.randn(k, n).astype(numpy.float32)
                ok = ok and numpy.array_equal(numpy.matmul(a, b), thin_gemm.matmul(a, b, threaded=False))
                bt = numpy.ascontiguousarray(b.T)
                ok = ok and numpy.array_equal(numpy.matmul(a, bt.T), thin_gemm.matmul(a, bt.T, threaded=False))
        _CANONICAL["checked"] = ok
    return _CANONICAL["checked"]


def _blasable(x):
    # x as numpy's matmul hands it to the BLAS (a unit stride in one of the last two axes), copied if need be
    item = x.itemsize
    return x if x.strides[-1] == item or x.strides[-2] == item else numpy.ascontiguousarray(x)


def _count(a, b):
    # the number of products in a stacked a @ b
    return math.prod(numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2]))


def _invariant_matmul(a, b, out):
    """``a @ b`` of float32 arrays with every element computed as OpenBLAS's large path does on one thread: by
    thin_gemm where OpenBLAS leaves that path, where a has few rows (:data:`FEW_ROWS`) or where it is one product of
    at most :data:`THIN_MULTIPLY_ADDS`, else by numpy's BLAS on one thread (:func:`_large_product`); with a BLAS that
    fails :func:`canonical_blas`, by thin_gemm always."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if not canonical_blas() or thin_gemm.is_thin(m, n, k) or m < FEW_ROWS[b.strides[-2] == b.itemsize and n > 1] or \
            m * n * k <= THIN_MULTIPLY_ADDS and _count(a, b) == 1:
        return thin_gemm.matmul(a, b, out, threaded=False)
    return _large_product(_blasable(a), _blasable(b), out)


# the rows of a below which thin_gemm computes a product faster than OpenBLAS on one thread, which packs all of b
# for however few rows (benchmarks/bench_batch_invariance.py --products, docs/performance.md): b the transpose of a
# C-contiguous matrix (InnerProduct's x @ W.T; AlexNet's fc6 at batch 10: 15.2 ms against 31.0, at 32 rows 32
# against 39, at 64 60 against 51), and b C-contiguous (a convolution's columns; 4 rows: 0.5-0.9 times OpenBLAS's
# time, 10 rows up to 1.9 times)
FEW_ROWS = {True: 32, False: 8}
# multiply-adds up to which one product goes to thin_gemm whatever its rows: on one thread it is as fast as OpenBLAS's
# there (which packs both operands; 50 x 500 x 64, LeNet's second convolution at batch 1: 26 us against 28;
# 64 x 256 x 256: 47 against 61), and it shares such a product between the threads in pieces of rows or columns
# where OpenBLAS's pieces would leave its large path (below thin_gemm.SMALL_MNK each). A stack of them goes to
# OpenBLAS, which thin_gemm computes one by one (copying a transposed a for each) at 0.4 to 0.9 times its speed: F(4,3)
# Winograd's 36 tile-position products of ResNet-50 at batch 4 (64 x 64 x 784 to 256 x 256 x 64, docs/performance.md)
THIN_MULTIPLY_ADDS = 1 << 22


# multiply-adds from which a product under the switch is split over the kernel threads: about 100 us on one core of
# this project's machine, where making and sharing the jobs costs about 30 us (its Python with the caches cold after
# the product before: 50 x 500 x 640, LeNet's second convolution at batch 10, 16M, 270 us on one thread, 196 shared;
# the product threads take a job in about a microsecond). The products up to THIN_MULTIPLY_ADDS go to thin_gemm
SPLIT_MULTIPLY_ADDS = 1 << 22


def _large_product(a, b, out, accumulate=False, invariant=True):
    """``out = a @ b`` (``accumulate``: ``out += a @ b``) of float32 arrays (numpy's matmul rules; ``out`` of the
    product's shape, or None) on OpenBLAS's large path, each BLAS call on one thread (:func:`one_blas_thread`): a
    stack of products split by matrices over the kernel threads, one matrix by columns where it is at least twice as
    wide as high, else by rows. A product is accumulated in place by cblas_sgemm, or, with a BLAS without it, in
    pieces of at most :data:`PIECE_BYTES` of ``out`` (each piece's product a temporary). Pieces that are cblas_sgemm
    calls run as jobs on the product threads (threadpool.run_jobs), others on parallel_for's. Each piece's elements
    are the same FMA chains as the whole product's, so the split changes no bit; a piece OpenBLAS would compute off
    its large path goes to thin_gemm, unless not ``invariant`` (a weight gradient, a sum over the batch whatever the
    arithmetic: OpenBLAS's small-matrix kernel and GEMV are faster there than thin_gemm and a temporary)."""
    batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if out is None:
        out = numpy.empty(batch + (m, n), numpy.float32)
    count = math.prod(batch)
    # inside a parallel_for body the pieces would run one after the other on this thread, each packing its operands
    threads = 1 if within_parallel_for() else min(num_threads(), count * m * n * k // SPLIT_MULTIPLY_ADDS)
    control = _openblas_control()
    temporary = accumulate and not (control and control[2] is not None)  # its pieces' products are temporaries
    with one_blas_thread():
        stacks = [_stack(x, batch, count) for x in (a, b, out)] if threads > 1 and count > 1 else [None]
        if all(x is not None for x in stacks):
            sa, sb, so = stacks
            jobs = _sgemm_jobs(sa, sb, so, accumulate, threads, "matrices", invariant)
            if jobs is not None:
                run_jobs(jobs)
            else:
                parallel_for(count, lambda lo, hi: _piece(sa[lo:hi], sb[lo:hi], so[lo:hi], accumulate, invariant),
                             work=MIN_PARALLEL_ELEMENTS)
        elif count == 1 and (threads > 1 or temporary and out.nbytes > PIECE_BYTES):
            a2, b2, o2 = (x.reshape(x.shape[-2:]) for x in (a, b, out))
            # by columns where out is at least twice as wide as high, else by rows: two threads writing the halves of
            # every row of out cost more than each packing the other operand (500 x 50 x 640, LeNet's second
            # convolution's data gradient at batch 10: 268 us by columns, 204 by rows; 50 x 500 x 640: 240 and 297)
            columns = 2 * m <= n
            length = n if columns else m
            units = -(-length // 16)
            pieces = max(threads, -(-out.nbytes // PIECE_BYTES) if temporary else 1)
            pieces = max(1, min(pieces, units, m * n * k // (2 * thin_gemm.SMALL_MNK)))
            jobs = _sgemm_jobs(a2[None], b2[None], o2[None], accumulate, pieces, "columns" if columns else "rows",
                               invariant) if 1 < pieces <= threads else None
            if jobs is not None:
                run_jobs(jobs)
            else:
                cuts = [min(units * p // pieces * 16, length) for p in range(pieces + 1)]

                def piece(p):
                    start, stop = cuts[p], cuts[p + 1]
                    if columns:
                        return a2, b2[:, start:stop], o2[:, start:stop]
                    return a2[start:stop], b2, o2[start:stop]

                parallel_for(pieces, lambda lo, hi: [_piece(*piece(p), accumulate, invariant) for p in range(lo, hi)],
                             work=MIN_PARALLEL_ELEMENTS if threads > 1 else 0)
        else:
            stacks = [_stack(x, batch, count) for x in (a, b, out)] if accumulate else [None]
            if all(x is not None for x in stacks):  # matrix by matrix, each accumulated in place by cblas_sgemm
                for sa, sb, so in zip(*stacks):  # (a stack of them, or one behind axes of one, 2-D as it needs)
                    _piece(sa, sb, so, accumulate, invariant)
            else:
                _piece(a, b, out, accumulate, invariant)
    return out


# the most of an accumulated product's output one piece adds at a time under the switch (the piece's temporary):
# AlexNet's fc6 weight gradient is 151 MB (see add_matmul)
PIECE_BYTES = 16 << 20


def _stack(x, batch, count):
    # x broadcast to the batch as a (count, rows, columns) view, or None where that would take a copy
    view = (numpy.broadcast_to(x, batch + x.shape[-2:]) if x.shape[:-2] != batch else x).reshape(
        (count,) + x.shape[-2:])
    return view if numpy.may_share_memory(view, x) else None


def _piece(a, b, out, accumulate, invariant):
    # out (+)= a @ b on this thread, on one BLAS thread, each element a large-path FMA chain where invariant
    # (accumulated into out in place by cblas_sgemm where this BLAS has it)
    thin = invariant and thin_gemm.is_thin(a.shape[-2], b.shape[-1], a.shape[-1])
    if not accumulate:
        if thin:
            thin_gemm.matmul(a, b, out, threaded=False)
        else:
            numpy.matmul(a, b, out=out)
    elif thin:
        out += thin_gemm.matmul(a, b, threaded=False)
    elif not (out.ndim == 2 and _sgemm_accumulate(a, b, out)):
        out += numpy.matmul(a, b)


def _bf16_kernel(a, b):
    """Whether ``a @ b`` goes to kernels/bf16_gemm.py: bf16 precision, float32 matrices, a CPU with AVX512_BF16."""
    return (gemm_precision() == "bf16" and a.dtype == numpy.float32 and b.dtype == numpy.float32 and a.ndim >= 2
            and b.ndim >= 2 and bf16_gemm.available())


def round_to_bfloat16(x):
    """float32 ``x`` rounded to the nearest bfloat16 (ties to even), as float32; NaN stays NaN."""
    u = numpy.ascontiguousarray(x, dtype=numpy.float32).view(numpy.uint32)
    rounded = ((u + (numpy.uint32(0x7FFF) + ((u >> 16) & 1))) & numpy.uint32(0xFFFF0000)).view(numpy.float32)
    return numpy.where(numpy.isnan(x), x, rounded)


def _operands(a, b):
    """``a``, ``b`` as the products see them: rounded to fp16 / bf16 under those precisions (float32 only)."""
    precision = gemm_precision() if a.dtype == numpy.float32 else "fp32"
    if precision == "fp16":
        return a.astype(numpy.float16).astype(numpy.float32), b.astype(numpy.float16).astype(numpy.float32)
    if precision == "bf16":
        return round_to_bfloat16(a), round_to_bfloat16(b)
    return a, b


_FLOAT32 = numpy.dtype(numpy.float32)
# where matmul sends a product of two float32 numpy matrices (or stacks of them), by the switches' state (batch
# invariance, precision): "thin" (_invariant_matmul), "numpy" (numpy.matmul) or "other"
# (the general path: fp16 / bf16 rounding, the bf16 kernel). One look-up where the general path's checks cost
# microseconds: LeNet's products at batch 1 take 1 to 30 us
_ROUTES = {}


def _float32_route():
    if gemm_precision() in ("fp16", "bf16"):
        route = "other"
    else:
        route = "thin" if batch_invariant() else "numpy"
    _ROUTES[_BATCH_INVARIANT["on"], _PRECISION["gemm"]] = route
    return route


def matmul(a, b, out=None):
    """``a @ b`` (numpy's matmul rules: (..., m, k) @ (..., k, n), batch axes broadcast) under the precision
    switch; into ``out`` when given. cupy arrays go to cuBLAS (``kernels/cuda/gemm.py``)."""
    if type(a) is numpy.ndarray and type(b) is numpy.ndarray and a.dtype is _FLOAT32 and b.dtype is _FLOAT32 and \
            a.ndim >= 2 and b.ndim >= 2:
        route = _ROUTES.get((_BATCH_INVARIANT["on"], _PRECISION["gemm"])) or _float32_route()
        if route == "thin":
            return _invariant_matmul(a, b, out)
        if route == "numpy":
            return numpy.matmul(a, b, out=out)
    if get_array_module(a, b) is not numpy:
        from .cuda.gemm import gemm_gpu
        return gemm_gpu(a, b, out, gemm_precision(), invariant=batch_invariant())
    if _bf16_kernel(a, b):
        return bf16_gemm.matmul(a, b, out)
    a, b = _operands(a, b)
    if a.dtype == numpy.float32 and b.dtype == numpy.float32 and a.ndim >= 2 and b.ndim >= 2 and batch_invariant():
        return _invariant_matmul(a, b, out)
    return numpy.matmul(a, b, out=out)


def add_matmul(c, a, b, overwrite=False):
    """``c += a @ b`` (2-D, or batched as :func:`matmul`) for arrays of one float dtype, under the precision
    switch; with ``overwrite``, ``c = a @ b`` through the same path (c's old values never read: a weight gradient
    whose zeros were deferred, Blob.diff_to_overwrite); returns c."""
    if get_array_module(c, a, b) is not numpy:
        from .cuda.gemm import gemm_gpu
        return gemm_gpu(a, b, c, gemm_precision(), accumulate=not overwrite, invariant=batch_invariant())
    if _bf16_kernel(a, b) and c.dtype == numpy.float32 and c.shape == numpy.broadcast_shapes(
            c.shape, a.shape[:-1] + b.shape[-1:]):
        return bf16_gemm.matmul(a, b, c, accumulate=not overwrite)
    a, b = _operands(a, b)
    # under the switch a weight gradient large enough to split goes over the kernel threads (the pass holds OpenBLAS
    # to one thread); it sums over the batch, so it need not be computed as the large path does. A smaller one (conv1's
    # per-image gradients, an outer product at batch 1) takes the plain path below, in one call
    if c.dtype == a.dtype == b.dtype == numpy.float32 and a.ndim >= 2 and b.ndim >= 2 and batch_invariant() and \
            c.size * a.shape[-1] >= 2 * SPLIT_MULTIPLY_ADDS and \
            c.shape == numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]):
        return _large_product(_blasable(a), _blasable(b), c, accumulate=not overwrite, invariant=False)
    gemm = None
    scipy_blas = _scipy_blas() if c.ndim == 2 and c.nbytes >= MIN_BYTES and c.flags.c_contiguous else None
    if scipy_blas is not None:
        gemm = {numpy.dtype(numpy.float32): scipy_blas.sgemm, numpy.dtype(numpy.float64): scipy_blas.dgemm}.get(c.dtype)
    if gemm is None or a.dtype != c.dtype or b.dtype != c.dtype:
        if a.shape[-1] == 1 and c.ndim == 2:  # an outer product (a weight gradient at batch 1): see below
            if overwrite:
                numpy.multiply(a, b, out=c)
            else:
                c += a * b
        elif overwrite:
            numpy.matmul(a, b, out=c)
        else:
            c += a @ b
        return c
    # c (m, n) in C order is c.T (n, m) in Fortran order, and c.T += b.T @ a.T
    p, ta = _fortran_operand(b.T)
    q, tb = _fortran_operand(a.T)
    out = gemm(1.0, p, q, beta=0.0 if overwrite else 1.0, c=c.T, trans_a=ta, trans_b=tb, overwrite_c=1)
    if not numpy.shares_memory(out, c):
        c[...] = out.T
    return c
