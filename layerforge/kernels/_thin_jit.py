"""The compiled part of kernels/thin_gemm.py (imported at its first product, as kernels/_bf16_jit.py): two
micro-kernels in LLVM IR that keep 16 or 64 FMA chains in vector registers, and the numba loops around them.

Every chain is ``acc = fma(a[k], b[k, j], acc)`` from zero over one block of k, in the order of k (``llvm.fma``:
one rounding per step, as OpenBLAS's kernels); the loops add each block's chains to the sum of the blocks before.

- ``chain_nn64`` / ``chain_nn16``: 64 or 16 columns of a C-contiguous b, four rows of a (one: ``_row``): 16 zmm
  chains (or fewer), each k step a broadcast of each row's a[k] times the vector loads of b's row k. Where numba
  compiles for a CPU without AVX-512 (AVX2: 16 ymm registers of 8 floats), the columns go in groups of at most 12
  ymm chains, each group its own pass over k (:data:`LANES`).
- ``chain_nt`` / ``chain_nt_row``: 16 rows of a C-contiguous bt (b = bt.T: InnerProduct's ``x @ W.T``; fewer at
  its end, the last row read again in their place), four rows of a or one. The chains run across rows of bt while
  its rows are contiguous along k, so each 16 x 16 block of bt is loaded as 16 vectors and transposed in registers
  (four stages of two-vector shuffles, each swapping one bit of the row index with the same bit of the column
  index: 64 shuffles per 256 multiply-adds of one row of a, which bound the one-row kernel at about 4
  multiply-adds a cycle; four rows of a share each transposed block); the k left after the last whole 16 go one
  vector of 16 loaded values at a time.

Each kernel writes its chains straight into c (the first block) or adds them to c (the later ones), so no Python or
numba loop copies results element by element. An element's chain is the same whatever the vector width, so the bits
are too.
"""
import numba
import numpy
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import compile_lock

f32 = ir.FloatType()
f32x16, i32, i64 = ir.VectorType(f32, 16), ir.IntType(32), ir.IntType(64)
PREFETCH = 1024  # bytes ahead in each row of bt that chain_nt asks the cache for


LANES = 16 if "avx512f" in compile_lock.target_features() else 8  # floats of a vector register numba compiles for
CHAINS = 12  # ymm chains of one pass of chain_nn where LANES is 8: 4 of the 16 registers left for b's rows and a[k]


def _fma(builder, kind=f32x16):
    name = f"llvm.fma.v{kind.count}f32"
    return builder.module.declare_intrinsic(name, fnty=ir.FunctionType(kind, [kind] * 3))


def _splat(builder, value, kind=f32x16):
    one = builder.insert_element(ir.Constant(kind, None), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(one, ir.Constant(kind, None), ir.Constant(ir.VectorType(i32, kind.count), None))


def _pointer(builder, address, offset_bytes, kind):
    return builder.inttoptr(builder.add(address, offset_bytes), kind.as_pointer())


def _store(builder, chains, add):
    # each (acc, address) of chains: c = acc where the block is the first (add 0), else c = c + acc (the blocks'
    # sums added in order); one branch for all, so that a first block does not read c
    targets = [(acc, builder.inttoptr(address, acc.type.as_pointer())) for acc, address in chains]
    with builder.if_else(builder.icmp_unsigned("!=", add, ir.Constant(i64, 0))) as (later, first):
        with later:
            for acc, target in targets:
                builder.store(builder.fadd(builder.load(target, align=4), acc), target, align=4)
        with first:
            for acc, target in targets:
                builder.store(acc, target, align=4)


def _chain_nn(vectors, rows, lanes=LANES):
    """The intrinsic ``chain(a_addr, lda, b_addr, ldb, k0, count, c_addr, ldc, add)``: chains over k in
    [k0, k0 + count) of a[r, k] * b[k, 0:16 vectors] for ``rows`` rows of a (float32, rows lda floats apart, at
    a_addr), b's first column at b_addr (rows ldb floats apart), written (``add`` 0) or added (else) to c's rows
    ldc floats apart from c_addr. rows x vectors independent chains, so that the FMA latency is hidden; in vectors of
    ``lanes`` floats, 8 in passes over k of at most :data:`CHAINS` chains each."""
    kind = ir.VectorType(f32, lanes)
    per_row = vectors * 16 // lanes  # vectors of `lanes` floats in a row of the columns
    width = per_row if lanes == 16 else max(1, CHAINS // rows)
    passes = [range(v, min(v + width, per_row)) for v in range(0, per_row, width)]

    @intrinsic
    def chain(typingctx, a_addr, lda, b_addr, ldb, k0, count, c_addr, ldc, add):
        sig = types.void(*[types.intp] * 9)

        def codegen(context, builder, signature, args):
            a_base, la, b_base, ld, start, n, out, ldc, add = args
            fma = _fma(builder, kind)
            four = ir.Constant(i64, 4)
            zero = ir.Constant(kind, [0.0] * lanes)
            a_rows = [builder.add(a_base, builder.mul(builder.mul(la, four), ir.Constant(i64, r))) for r in range(rows)]
            c_rows = [builder.add(out, builder.mul(builder.mul(ldc, four), ir.Constant(i64, r))) for r in range(rows)]
            for columns in passes:
                acc = {(r, h): cgutils.alloca_once_value(builder, zero) for r in range(rows) for h in columns}
                for cell in acc.values():
                    builder.store(zero, cell)
                with cgutils.for_range(builder, n) as loop:
                    k = builder.add(start, loop.index)
                    row = builder.add(b_base, builder.mul(builder.mul(k, ld), four))
                    b = {h: builder.load(_pointer(builder, row, ir.Constant(i64, 4 * lanes * h), kind), align=4)
                         for h in columns}
                    for r in range(rows):
                        x = _splat(builder, builder.load(_pointer(builder, a_rows[r], builder.mul(k, four), f32)), kind)
                        for h in columns:
                            builder.store(builder.call(fma, [x, b[h], builder.load(acc[r, h])]), acc[r, h])
                _store(builder, [(builder.load(acc[r, h]), builder.add(c_rows[r], ir.Constant(i64, 4 * lanes * h)))
                                 for r in range(rows) for h in columns], add)
            return context.get_dummy_value()
        return sig, codegen
    return chain


ROWS = 4  # rows of a per call of the chain_nn kernels
PANEL_BYTES = 256 << 10  # of b's rows in a block of k, which every row of a then reads from the cache
PACK_ROWS = 256  # rows of a from which a panel is copied first: fewer read it too few times to repay the copy
chain_nn64, chain_nn16 = _chain_nn(4, ROWS), _chain_nn(1, ROWS)
chain_nn64_row, chain_nn16_row = _chain_nn(4, 1), _chain_nn(1, 1)


def _transpose(builder, rows):
    # 16 vectors of 16 -> their transpose: stage s swaps bit s of the row index with bit s of the column index
    for s in (1, 2, 4, 8):
        low = ir.Constant(ir.VectorType(i32, 16), [e if not e & s else 16 + e - s for e in range(16)])
        high = ir.Constant(ir.VectorType(i32, 16), [e + s if not e & s else 16 + e for e in range(16)])
        out = list(rows)
        for i in range(16):
            if not i & s:
                out[i] = builder.shuffle_vector(rows[i], rows[i + s], low)
                out[i + s] = builder.shuffle_vector(rows[i], rows[i + s], high)
        rows = out
    return rows


def _chain_nt(rows_a):
    """The intrinsic ``chain(a_addr, lda, bt_addr, ldb, rows, k0, count, c_addr, ldc, add)``: c[r, 0:16] =
    (``add`` 0) or += (else) chains over k in [k0, k0 + count) of a[r, k] * bt[0:16, k] for ``rows_a`` rows of a
    (float32, lda floats apart, at a_addr), bt's row 0 at bt_addr, its rows ldb floats apart (past its first
    ``rows`` rows, bt's last row is read again: the lanes past ``rows`` are for the caller to drop), c's rows ldc
    floats apart. Each block of bt is transposed once for all the rows of a."""
    @intrinsic
    def chain(typingctx, a_addr, lda, bt_addr, ldb, rows, k0, count, c_addr, ldc, add):
        sig = types.void(*[types.intp] * 10)

        def codegen(context, builder, signature, args):
            a_base, la, b_base, ld, count_rows, start, n, out, ldc, add = args
            fma = _fma(builder)
            prefetch = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(
                ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]))
            four = ir.Constant(i64, 4)
            row_bytes = builder.mul(ld, four)
            last = builder.sub(count_rows, ir.Constant(i64, 1))
            offsets = []  # row t's byte offset: t, or the last row where t is past it
            for t in range(16):
                row = builder.select(builder.icmp_signed("<", ir.Constant(i64, t), count_rows), ir.Constant(i64, t),
                                     last)
                offsets.append(builder.mul(row_bytes, row))
            a_rows = [builder.add(a_base, builder.mul(builder.mul(la, four), ir.Constant(i64, r)))
                      for r in range(rows_a)]
            zero = ir.Constant(f32x16, [0.0] * 16)
            acc = [cgutils.alloca_once_value(builder, zero) for _ in range(rows_a)]
            for r in range(rows_a):
                builder.store(zero, acc[r])
            whole = builder.udiv(n, ir.Constant(i64, 16))
            with cgutils.for_range(builder, whole) as loop:
                k = builder.add(start, builder.mul(loop.index, ir.Constant(i64, 16)))
                column = builder.mul(k, four)
                starts = [builder.add(b_base, offsets[t]) for t in range(16)]
                for t in range(16):  # each row's line PREFETCH bytes ahead: 16 streams are more than the prefetchers
                    ahead = _pointer(builder, starts[t], builder.add(column, ir.Constant(i64, PREFETCH)),
                                     ir.IntType(8))
                    builder.call(prefetch, [ahead, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
                rows = [builder.load(_pointer(builder, starts[t], column, f32x16), align=4) for t in range(16)]
                values = [builder.load(acc[r]) for r in range(rows_a)]
                for u, col in enumerate(_transpose(builder, rows)):
                    for r in range(rows_a):
                        x = builder.load(_pointer(builder, a_rows[r], builder.add(column, ir.Constant(i64, 4 * u)),
                                                  f32))
                        values[r] = builder.call(fma, [_splat(builder, x), col, values[r]])
                for r in range(rows_a):
                    builder.store(values[r], acc[r])
            with cgutils.for_range(builder, builder.sub(n, builder.mul(whole, ir.Constant(i64, 16)))) as loop:
                k = builder.add(builder.add(start, builder.mul(whole, ir.Constant(i64, 16))), loop.index)
                column = builder.mul(k, four)
                col = ir.Constant(f32x16, None)
                for t in range(16):
                    element = _pointer(builder, builder.add(b_base, offsets[t]), column, f32)
                    col = builder.insert_element(col, builder.load(element), ir.Constant(i32, t))
                for r in range(rows_a):
                    x = builder.load(_pointer(builder, a_rows[r], column, f32))
                    builder.store(builder.call(fma, [_splat(builder, x), col, builder.load(acc[r])]), acc[r])
            _store(builder, [(builder.load(acc[r]), builder.add(out, builder.mul(builder.mul(ldc, four),
                                                                                ir.Constant(i64, r))))
                             for r in range(rows_a)], add)
            return context.get_dummy_value()
        return sig, codegen
    return chain


chain_nt, chain_nt_row = _chain_nt(ROWS), _chain_nt(1)


jit = compile_lock.njit(nogil=True, fastmath={"contract"})
# Where a kernel reaches its arrays' elements through addresses, it is compiled for one signature of these, whatever
# the arrays' layouts, read-only flags and literal arguments (numba compiles a kernel again for each: a second or two
# apiece, up to eight of them for one kernel in ResNet-50's first step). Not for loops over the elements themselves:
# over an "A" array numba's loops are not vectorised (thin_gemm's stream() took 2.7x as long).
INPUT2, INPUT3 = types.Array(types.float32, 2, "A", readonly=True), types.Array(types.float32, 3, "A", readonly=True)
OUTPUT2, OUTPUT3 = types.Array(types.float32, 2, "A"), types.Array(types.float32, 3, "A")
BLOCKS = types.Array(types.int64, 2, "A", readonly=True)


@compile_lock.njit(types.void(INPUT2, INPUT2, types.Array(types.float32, 2, "C"), BLOCKS, types.int64, types.int64,
                              types.boolean, types.int64), nogil=True, fastmath={"contract"})
def gemm(a, b, c, blocks, j0, j1, transposed, width):
    """c[:, j0:j1] = a @ b[:, j0:j1] (a (M, K), b (K, N) or, ``transposed``, bt (N, K), c (M, N), all C-contiguous;
    j1 - j0 a multiple of ``width``, 64 or 16, but transposed, where the last group of 16 may be short)."""
    ld, lda, ldc, m = b.shape[1], a.shape[1], c.shape[1], a.shape[0]
    if not transposed:
        # where the columns take more than one panel (PANEL_BYTES of b's rows in a block of k), block by block of k
        # and panel by panel, so that every row of a reads a panel from the cache (from PACK_ROWS rows of a, a
        # contiguous copy of it); an element's blocks are still added in order, so the same bits. Otherwise row by
        # row, each row's blocks in turn (a long a read in order)
        panel = max(width, PANEL_BYTES // (4 * max(1, blocks[0, 1] - blocks[0, 0])) // width * width)
        outer = blocks.shape[0] if panel < j1 - j0 else 1
        pack = outer > 1 and m >= PACK_ROWS
        packed = numpy.empty((blocks[0, 1] - blocks[0, 0], panel) if pack else (0, 0), numpy.float32)
        for qo in range(outer):
            q0, q1 = (qo, qo + 1) if outer > 1 else (0, blocks.shape[0])
            for p0 in range(j0, j1, panel):
                p1 = min(j1, p0 + panel)
                if pack:
                    k0, k1 = blocks[qo, 0], blocks[qo, 1]
                    packed[:k1 - k0, :p1 - p0] = b[k0:k1, p0:p1]
                i = 0
                while i < m:
                    rows = ROWS if i + ROWS <= m else 1
                    a_row = a[i].ctypes.data
                    for jb in range(p0, p1, width):
                        out = c[i, jb:].ctypes.data
                        at, start, ld_b = a_row, b[0, jb:].ctypes.data, ld
                        if pack:
                            start, ld_b = packed[0, jb - p0:].ctypes.data, panel
                        for q in range(q0, q1):
                            k0, count, add = blocks[q, 0], blocks[q, 1] - blocks[q, 0], 1 if q else 0
                            if pack:  # the block's k counted from its first: a's columns from there
                                at, k0 = a_row + 4 * k0, 0
                            if rows == ROWS:
                                if width == 64:
                                    chain_nn64(at, lda, start, ld_b, k0, count, out, ldc, add)
                                else:
                                    chain_nn16(at, lda, start, ld_b, k0, count, out, ldc, add)
                            elif width == 64:
                                chain_nn64_row(at, lda, start, ld_b, k0, count, out, ldc, add)
                            else:
                                chain_nn16_row(at, lda, start, ld_b, k0, count, out, ldc, add)
                    i += rows
        return
    part = numpy.empty((ROWS, 16), numpy.float32)  # a short group's chains, whose last lanes are dropped
    i = 0
    while i < m:
        rows = ROWS if i + ROWS <= m else 1
        a_row = a[i].ctypes.data
        for jb in range(j0, j1, width):
            lanes = min(width, j1 - jb)
            start = b[jb].ctypes.data
            out, ld_out = (c[i, jb:].ctypes.data, ldc) if lanes == width else (part.ctypes.data, 16)
            for q in range(blocks.shape[0]):
                k0, count, add = blocks[q, 0], blocks[q, 1] - blocks[q, 0], 1 if q else 0
                if rows == ROWS:
                    chain_nt(a_row, lda, start, ld, lanes, k0, count, out, ld_out, add)
                else:
                    chain_nt_row(a_row, lda, start, ld, lanes, k0, count, out, ld_out, add)
            if lanes < width:
                for r in range(rows):
                    for t in range(lanes):
                        c[i + r, jb + t] = part[r, t]
        i += rows


@jit
def product(a, b, c, blocks):
    """c = a @ b on this thread (a (M, K), b (K, N), c (M, N), each with C-contiguous rows; K > 0): 64 columns at a
    time, then 16, the last ones from a copy padded with zeros (or, for a few rows, :func:`stream`)."""
    m, n = a.shape[0], b.shape[1]
    if m < ROWS:
        stream(a, b, c, blocks, 0, n)
        return
    wide = n // 64 * 64
    narrow = wide + (n - wide) // 16 * 16
    if wide:
        gemm(a, b, c, blocks, 0, wide, False, 64)
    if narrow > wide:
        gemm(a, b, c, blocks, wide, narrow, False, 16)
    if narrow < n:
        padded = numpy.zeros((b.shape[0], 16), numpy.float32)
        padded[:, :n - narrow] = b[:, narrow:]
        part = numpy.empty((m, 16), numpy.float32)
        gemm(a, padded, part, blocks, 0, 16, False, 16)
        c[:, narrow:] = part[:, :n - narrow]


@jit
def matrix(a, b, c, blocks, transposed):
    """c = a @ b on this thread, as thin_gemm's one call for a product too small to share between threads: b (K, N)
    as :func:`product` takes it, or (``transposed``) bt (N, K), InnerProduct's W, in groups of 16 of its rows."""
    if transposed:
        gemm(a, b, c, blocks, 0, b.shape[0], True, 16)
    else:
        product(a, b, c, blocks)


@jit
def batch(a, b, c, blocks, i0, i1):
    """c[i] = a[i] @ b[i] for i in [i0, i1) (:func:`product` each): a convolution's small products, one per image,
    without a return to Python between them."""
    for i in range(i0, i1):
        product(a[i], b[i], c[i], blocks)


STREAM = 4096  # columns of c whose chains one pass of stream() keeps in the cache


@jit
def stream(a, b, c, blocks, j0, j1):
    """c[:, j0:j1] = a @ b[:, j0:j1] for a few rows of a (a GEMV: a data gradient ``gy @ W`` of one image) with b
    C-contiguous: each k step adds a[i, k] times b's row k to a row of STREAM chains in the cache (vectorised across
    the columns), so that b is read row after row, as it lies, rather than in strips of 64 columns."""
    acc = numpy.empty(STREAM, numpy.float32)
    for i in range(a.shape[0]):
        for jc in range(j0, j1, STREAM):
            width = min(STREAM, j1 - jc)
            for q in range(blocks.shape[0]):
                acc[:width] = 0
                for kk in range(blocks[q, 0], blocks[q, 1]):
                    x = a[i, kk]
                    row = b[kk, jc:jc + width]
                    for t in range(width):
                        acc[t] = x * row[t] + acc[t]
                if q == 0:
                    c[i, jc:jc + width] = acc[:width]
                else:
                    for t in range(width):
                        c[i, jc + t] = c[i, jc + t] + acc[t]
