"""The compiled part of kernels/bf16_gemm.py (imported at its first product: importing numba takes a quarter of a
second, compiling these loops a few seconds the first time on a machine; numba caches them on disk beside this
module): the packing loops, the driver, and the 12 x 32 micro-kernel in LLVM IR around VDPBF16PS."""
import numba
import numpy
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import compile_lock

MR, NR = 12, 32  # the micro-tile of c: 12 rows x 32 columns (2 zmm registers per row)
KC = 384  # k values per block: a B panel of KC x NR bfloat16 is 24 KiB (the L1 cache)
MC = 192  # rows of A per block: 144 KiB of bfloat16 panels (the L2 cache)


class BFloat(ir.Type):  # llvmlite's IR builder has no bfloat type: the intrinsic's operands are <32 x bfloat>
    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, BFloat)

    def __hash__(self):
        return hash("bfloat")


f32x16, i32x16 = ir.VectorType(ir.FloatType(), 16), ir.VectorType(ir.IntType(32), 16)
bf16x32 = ir.VectorType(BFloat(), 32)
i32, i64 = ir.IntType(32), ir.IntType(64)


@intrinsic
def micro(typingctx, a_addr, b_addr, pairs, c_addr, ldc):
    """c tile (12 x 32 float32 at c_addr, rows ldc floats apart) += A panel (pairs, 12) @ B panel (pairs, 32),
    words of two bfloat16 (k pairs) at a_addr and b_addr."""
    sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        a_base, b_base, count, c_base, ld = args
        dot = builder.module.declare_intrinsic("llvm.x86.avx512bf16.dpbf16ps.512",
                                               fnty=ir.FunctionType(f32x16, [f32x16, bf16x32, bf16x32]))
        tile = [[cgutils.alloca_once(builder, f32x16) for _ in range(2)] for _ in range(MR)]
        row_bytes = builder.mul(ld, ir.Constant(i64, 4))
        rows = [builder.add(c_base, builder.mul(row_bytes, ir.Constant(i64, r))) for r in range(MR)]

        def c_pointer(r, h):
            return builder.inttoptr(builder.add(rows[r], ir.Constant(i64, 64 * h)), f32x16.as_pointer())
        for r in range(MR):
            for h in range(2):
                builder.store(builder.load(c_pointer(r, h), align=4), tile[r][h])
        zeros = ir.Constant(ir.VectorType(i32, 16), None)
        with cgutils.for_range(builder, count) as loop:
            k = loop.index
            b_at = builder.add(b_base, builder.mul(k, ir.Constant(i64, 4 * NR)))
            b = [builder.bitcast(builder.load(builder.inttoptr(builder.add(b_at, ir.Constant(i64, 64 * h)),
                                                               i32x16.as_pointer()), align=4), bf16x32)
                 for h in range(2)]
            a_at = builder.add(a_base, builder.mul(k, ir.Constant(i64, 4 * MR)))
            for r in range(MR):
                pair = builder.load(builder.inttoptr(builder.add(a_at, ir.Constant(i64, 4 * r)),
                                                     i32.as_pointer()), align=4)
                splat = builder.shuffle_vector(builder.insert_element(ir.Constant(i32x16, None), pair,
                                                                      ir.Constant(i32, 0)),
                                               ir.Constant(i32x16, None), zeros)
                a = builder.bitcast(splat, bf16x32)
                for h in range(2):
                    builder.store(builder.call(dot, [builder.load(tile[r][h]), a, b[h]]), tile[r][h])
        for r in range(MR):
            for h in range(2):
                builder.store(builder.load(tile[r][h]), c_pointer(r, h), align=4)
        return context.get_dummy_value()
    return sig, codegen


jit = compile_lock.njit(nogil=True)


@jit
def to_bf16(u):
    # float32 bits -> bfloat16 bits, nearest, ties to even; NaN stays a (quiet) NaN (branch-free: vectorised)
    rounded = (u + numpy.uint32(0x7FFF) + ((u >> numpy.uint32(16)) & numpy.uint32(1))) >> numpy.uint32(16)
    nan = (u & numpy.uint32(0x7FFFFFFF)) > numpy.uint32(0x7F800000)
    return numpy.uint16(((u >> numpy.uint32(16)) | numpy.uint32(0x40)) if nan else rounded)


@jit
def pair(lo, hi):
    # two float32 bit patterns -> one 32-bit word of two bfloat16, ``lo`` in the low half (the even k)
    return numpy.uint32(to_bf16(lo)) | (numpy.uint32(to_bf16(hi)) << numpy.uint32(16))


@jit
def pack_a(au, m0, mc, k0, kc, out):
    # rows m0 .. m0 + mc, k values k0 .. k0 + kc of a (uint32 bits) -> words (panels, pairs, MR), zero-padded
    pairs, whole = (kc + 1) // 2, kc // 2
    out[:, :pairs] = 0
    for m in range(mc):
        p, r = m // MR, m % MR
        row = au[m0 + m, k0:k0 + kc]
        dst = out[p, :, r]
        for q in range(whole):
            dst[q] = pair(row[2 * q], row[2 * q + 1])
        if whole < pairs:
            dst[whole] = numpy.uint32(to_bf16(row[kc - 1]))


@jit
def pack_b(bu, k0, kc, nc, out):
    # k values k0 .. k0 + kc, columns 0 .. nc of b -> words (panels, pairs, NR), zero-padded
    pairs, full = (kc + 1) // 2, nc // NR
    if full < out.shape[0]:
        out[full:, :pairs] = 0
    for q in range(pairs):
        top = bu[k0 + 2 * q]
        last = 2 * q + 1 == kc  # an odd k count: the pair's second value is 0
        bottom = bu[k0 + 2 * q + (0 if last else 1)]
        for p in range(full):
            dst = out[p, q]
            for j in range(NR):
                dst[j] = pair(top[p * NR + j], bottom[p * NR + j])
            if last:
                for j in range(NR):
                    dst[j] &= numpy.uint32(0xFFFF)
        for j in range(nc - full * NR):  # the last, partial panel
            word = pair(top[full * NR + j], bottom[full * NR + j])
            out[full, q, j] = word & numpy.uint32(0xFFFF) if last else word


@jit
def pack_a_columns(atu, m0, mc, k0, kc, out):
    # pack_a from a's transpose (K, M): rows of a are its columns (a transposed view: W^T of a data gradient)
    pairs = (kc + 1) // 2
    out[:, :pairs] = 0
    for q in range(pairs):
        top = atu[k0 + 2 * q, m0:m0 + mc]
        last = 2 * q + 1 == kc
        bottom = atu[k0 + 2 * q + (0 if last else 1), m0:m0 + mc]
        for m in range(mc):
            word = pair(top[m], bottom[m])
            out[m // MR, q, m % MR] = word & numpy.uint32(0xFFFF) if last else word


@jit
def pack_b_columns(btu, k0, kc, nc, out):
    # pack_b from b's transpose (N, K): b a transposed view (col^T or gy^T of a filter gradient). Each panel's
    # columns are first made words along their contiguous rows (vectorised, as pack_a), then the (32, pairs)
    # words are transposed into the panel in the cache
    pairs, whole = (kc + 1) // 2, kc // 2
    out[:, :pairs] = 0
    words = numpy.zeros((NR, pairs), numpy.uint32)
    for p in range((nc + NR - 1) // NR):
        width = min(NR, nc - p * NR)
        for j in range(width):
            column = btu[p * NR + j, k0:k0 + kc]
            row = words[j]
            for q in range(whole):
                row[q] = pair(column[2 * q], column[2 * q + 1])
            if whole < pairs:
                row[whole] = numpy.uint32(to_bf16(column[kc - 1]))
        dst = out[p]
        for q in range(pairs):
            for j in range(width):
                dst[q, j] = words[j, q]


@jit
def gemm(au, bu, a_by_columns, b_by_columns, c, accumulate, a_panels, b_panels, edge):
    """c (M, N, C-contiguous) = (c +, with ``accumulate``) bf16(a) @ bf16(b) for a (M, K), b (K, N) as uint32
    bits; ``au`` / ``bu`` hold the transposes (K, M) / (N, K) instead where ``a_by_columns`` / ``b_by_columns``
    (their rows are contiguous)."""
    m_total = au.shape[1] if a_by_columns else au.shape[0]
    k_total = au.shape[0] if a_by_columns else au.shape[1]
    n_total = bu.shape[0] if b_by_columns else bu.shape[1]
    if not accumulate:
        c[:] = 0
    ldc = c.shape[1]
    for k0 in range(0, k_total, KC):
        kc = min(KC, k_total - k0)
        pairs = (kc + 1) // 2
        if b_by_columns:
            pack_b_columns(bu, k0, kc, n_total, b_panels)
        else:
            pack_b(bu, k0, kc, n_total, b_panels)
        for m0 in range(0, m_total, MC):
            mc = min(MC, m_total - m0)
            if a_by_columns:
                pack_a_columns(au, m0, mc, k0, kc, a_panels)
            else:
                pack_a(au, m0, mc, k0, kc, a_panels)
            for j in range((n_total + NR - 1) // NR):
                n0, nc = j * NR, min(NR, n_total - j * NR)
                b_addr = b_panels[j].ctypes.data
                for i in range((mc + MR - 1) // MR):
                    r0, rc = m0 + i * MR, min(MR, mc - i * MR)
                    if rc == MR and nc == NR:
                        micro(a_panels[i].ctypes.data, b_addr, pairs, c[r0:, n0:].ctypes.data, ldc)
                    else:  # an edge tile: through a whole 12 x 32 tile
                        edge[:] = 0
                        edge[:rc, :nc] = c[r0:r0 + rc, n0:n0 + nc]
                        micro(a_panels[i].ctypes.data, b_addr, pairs, edge.ctypes.data, NR)
                        c[r0:r0 + rc, n0:n0 + nc] = edge[:rc, :nc]
