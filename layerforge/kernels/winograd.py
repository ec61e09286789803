"""Winograd convolution F(m x m, 3 x 3) for 3x3 stride-1 layers (Lavin & Gray 2016): forward, data and filter
gradients, numpy or cupy through ``xp``.

The output is cut into m x m tiles; each reads an alpha x alpha input tile (alpha = m + 2, tiles overlapping
by 2). With B, G, A the transforms of the tile size::

    V = B^T d B   (input tile),   U = G g G^T   (filter),   y_tile = A^T [ sum_c U[k, c] * V[c] ] A

The sum over input channels at each of the alpha^2 tile positions is one GEMM (K x C) @ (C x tiles), batched
over the positions: alpha^2 GEMMs of C K tiles multiply-adds against 9 m^2 in direct convolution, 2.25x
fewer for m = 2 and 4x for m = 4. The gradients are the exact adjoints of that computation:

    dM = A gy_tile A^T,   dU = sum_tiles dM V^T  ->  gW = G^T dU G,   dV = U^T dM  ->  gx tiles = B dV B^T

(the overlapping gx tiles add up). On the CPU, F(2,3)'s transforms (input tiles, output tiles, gradient
tiles, the filters and their gradient, and the gx scatter) are compiled loops over channels on the kernel threads (kernels.threadpool): each
tile's 4 x 4 transform is a handful of adds in registers, where the numpy path copies every tile position
out strided and runs small GEMMs over all tiles. F(4,3) and cupy use the ``xp`` path. Float rounding grows with m: the transforms of F(4,3) have entries up to
5 and 1/24 (the points 0, +-1, +-1/2, infinity), F(2,3) only 0, +-1/2, 1; docs/performance.md has the
measured float32 error of both against a float64 direct convolution.
"""
import math

import numpy

from ..backend import get_array_module
from .blas import matmul
from .output_size import conv_output_size
from .threadpool import cpu_kernel, into_contiguous, parallel_for

# (B^T, G, A^T) per output tile size m
TRANSFORMS = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
         [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
         [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}


def workspace_estimate(x_shape, out_channels, geometry, tile, itemsize, compiled=False):
    """Bytes a call holds at its peak, for input (N, C, H, W) and ``out_channels`` filters: the input tiles and
    their transform (and its transposed copies), the products and the output tiles; with ``compiled`` (F(2,3)
    on the CPU, whose loops write the transforms straight from and into the images) one transformed array of
    each side, input and output."""
    n, c, h, w = x_shape
    ph, pw = geometry[4:6]
    out_h, out_w = conv_output_size(h, 3, 1, ph), conv_output_size(w, 3, 1, pw)
    tiles = n * -(-out_h // tile) * -(-out_w // tile)
    if compiled:
        return (tile + 2) ** 2 * tiles * (c + out_channels) * itemsize
    return (tile + 2) ** 2 * tiles * (3 * c + 2 * out_channels) * itemsize


def eligible(geometry):
    """Whether a convolution ``(kh, kw, sy, sx, ph, pw, dy, dx)`` can run as Winograd F(m, 3): 3x3, stride 1,
    dilation 1 (any padding)."""
    kh, kw, sy, sx, ph, pw, dy, dx = geometry
    return (kh, kw, sy, sx, dy, dx) == (3, 3, 1, 1, 1, 1)


class WinogradConv:
    """The engine: ``forward`` / ``backward`` as the GEMM engines of kernels.implicit_gemm (same arguments).

    Not batch-invariant (``batch_invariant = False``): its GEMMs run over the tiles of the whole batch.

    Args:
        geometry: ``(kh, kw, sy, sx, ph, pw, dy, dx)``, which must be :func:`eligible`.
        group: convolution groups.
        tile: output tile size m (2 or 4).
    """

    batch_invariant = False

    def __init__(self, geometry, group, tile=4):
        if not eligible(geometry):
            raise ValueError(f"Winograd needs a 3x3 stride-1 undilated convolution, got geometry {geometry}")
        if tile not in TRANSFORMS:
            raise ValueError(f"Winograd tile {tile} is not one of {sorted(TRANSFORMS)}")
        self.geometry, self.group, self.m = tuple(geometry), group, tile
        self.name = f"WINOGRAD_F{tile}" if tile != 4 else "WINOGRAD"
        self._bytes = 0

    @property
    def workspace_bytes(self):
        """Bytes of the transformed tiles of the last call (V, M and the padded input)."""
        return self._bytes

    def release(self):
        self._bytes = 0

    def _matrices(self, xp, dtype):
        bt, g, at = (xp.asarray(numpy.array(t, dtype=numpy.float64), dtype=dtype) for t in TRANSFORMS[self.m])
        return bt, g, at

    def _layout(self, x_shape):
        n, c, h, w = x_shape
        ph, pw = self.geometry[4:6]
        out_h, out_w = conv_output_size(h, 3, 1, ph), conv_output_size(w, 3, 1, pw)
        th, tw = -(-out_h // self.m), -(-out_w // self.m)
        return out_h, out_w, th, tw

    def _tiles(self, x, dtype):
        """Input tiles (alpha, alpha, C, N th tw) of the zero-padded x, and the layout."""
        xp = get_array_module(x)
        n, c, h, w = x.shape
        ph, pw = self.geometry[4:6]
        out_h, out_w, th, tw = self._layout(x.shape)
        alpha = self.m + 2
        xpad = xp.zeros((n, c, th * self.m + 2, tw * self.m + 2), dtype=dtype)
        xpad[:, :, ph:ph + min(h, th * self.m + 2 - ph), pw:pw + min(w, tw * self.m + 2 - pw)] = \
            x[:, :, :th * self.m + 2 - ph, :tw * self.m + 2 - pw]
        d = xp.empty((alpha, alpha, c, n, th, tw), dtype=dtype)
        for i in range(alpha):
            for j in range(alpha):
                d[i, j] = xpad[:, :, i:i + th * self.m:self.m, j:j + tw * self.m:self.m].transpose(1, 0, 2, 3)
        self._bytes = d.nbytes + xpad.nbytes
        return d.reshape(alpha, alpha, c, n * th * tw)

    def _compiled(self, xp):
        # F(2,3) on numpy arrays: the compiled transforms below (module docstring)
        return self.m == 2 and xp is numpy

    def _filter_transform(self, W, g, compiled):
        """U = G w G^T of every filter, (a, a, K, C/G)."""
        if not compiled:
            return self._to_tiles(W.transpose(2, 3, 0, 1), g, g.T)
        k, cg = W.shape[:2]
        W = numpy.ascontiguousarray(W)
        U = numpy.empty((16, k, cg), dtype=W.dtype)
        parallel_for(k, lambda lo, hi: _f2_filter_tiles(W, lo, hi, U), work=U.size)
        return U.reshape(4, 4, k, cg)

    def _add_filter_gradient(self, dU, g, gW, compiled):
        """gW += G^T dU G for every filter, dU (a, a, K, C/G)."""
        if not compiled:
            gW += self._to_tiles(dU, g.T, g).transpose(2, 3, 0, 1)
            return
        k, cg = dU.shape[2:]
        parallel_for(k, lambda lo, hi: _f2_filter_gradient(dU.reshape(16, k, cg), lo, hi, gW), work=gW.size)

    def _input_transform(self, x, bt, compiled):
        """V = B^T d B of every input tile, (a, a, C, P)."""
        if not compiled:
            return self._to_tiles(self._tiles(x, x.dtype), bt, bt.T)
        n, c, h, w = x.shape
        _, _, th, tw = self._layout(x.shape)
        x = numpy.ascontiguousarray(x)
        V = numpy.empty((16, c, n, th, tw), dtype=x.dtype)
        ph, pw = self.geometry[4:6]
        parallel_for(c, lambda lo, hi: _f2_tiles(x, ph, pw, _F2_BT_ROWS, lo, hi, V), work=V.size // 16)
        self._bytes = V.nbytes
        return V.reshape(4, 4, c, n * th * tw)

    def _gradient_transform(self, gy, at, th, tw, compiled):
        """dM = A gy_tile A^T of every output tile (gy zero-padded to whole tiles), (a, a, K, P)."""
        n, k, out_h, out_w = gy.shape
        if not compiled:
            m = self.m
            xp = get_array_module(gy)
            gypad = xp.zeros((n, k, th * m, tw * m), dtype=gy.dtype)
            gypad[:, :, :out_h, :out_w] = gy
            gyt = gypad.reshape(n, k, th, m, tw, m).transpose(3, 5, 1, 0, 2, 4).reshape(m, m, k, n * th * tw)
            return self._to_tiles(gyt, at.T, at)
        gy = numpy.ascontiguousarray(gy)
        dM = numpy.empty((16, k, n, th, tw), dtype=gy.dtype)
        parallel_for(k, lambda lo, hi: _f2_tiles(gy, 0, 0, _F2_A_ROWS, lo, hi, dM), work=dM.size // 16)
        return dM.reshape(4, 4, k, n * th * tw)

    @staticmethod
    def _to_tiles(v, left, right):
        """``left @ v[:, :, r] @ right`` for every r of ``v`` (a, b, ...): two GEMMs over all tiles at once."""
        xp = get_array_module(v)
        a, b, rest = v.shape[0], v.shape[1], v.shape[2:]
        r = math.prod(rest)
        t = (left @ v.reshape(a, b * r)).reshape(left.shape[0], b, r)  # rows transformed
        out = xp.ascontiguousarray(t.transpose(0, 2, 1)).reshape(-1, b) @ right  # (L r, R)
        return xp.ascontiguousarray(out.reshape(left.shape[0], r, right.shape[1]).transpose(0, 2, 1)).reshape(
            (left.shape[0], right.shape[1]) + tuple(rest))

    def forward(self, x, W, b, y):
        """Write ``W * x (+ b)`` into ``y`` (N, Cout, out_h, out_w)."""
        xp = get_array_module(x)
        bt, g, at = self._matrices(xp, x.dtype)
        n, c = x.shape[:2]
        k, groups = W.shape[0], self.group
        out_h, out_w, th, tw = self._layout(x.shape)
        alpha, m = self.m + 2, self.m
        compiled = self._compiled(xp)
        V = self._input_transform(x, bt, compiled)  # (a, a, C, P)
        U = self._filter_transform(W, g, compiled)  # (a, a, K, C/G)
        kg, cg = k // groups, c // groups
        M = xp.empty((alpha, alpha, k, V.shape[-1]), dtype=x.dtype)
        for q in range(groups):
            matmul(U[:, :, q * kg:(q + 1) * kg], V[:, :, q * cg:(q + 1) * cg], out=M[:, :, q * kg:(q + 1) * kg])
        self._bytes += M.nbytes
        if compiled:
            _f2_output_tiles(M.reshape(16, k, n, th, tw), b, y)
            return
        Y = self._to_tiles(M, at, at.T).reshape(m, m, k, n, th, tw)  # (m, m, K, N, th, tw)
        full = Y.transpose(3, 2, 4, 0, 5, 1).reshape(n, k, th * m, tw * m)
        if b is None:
            y[...] = full[:, :, :out_h, :out_w]
        else:
            xp.add(full[:, :, :out_h, :out_w], b[None, :, None, None], out=y)

    def backward(self, x, W, gy, gW, gb, gx):
        """Add the filter (and bias) gradients into ``gW`` (``gb``); write the data gradient into ``gx``.
        Any of them may be None (not wanted)."""
        xp = get_array_module(gy)
        bt, g, at = self._matrices(xp, gy.dtype)
        n, c, h, w = x.shape
        k, groups = W.shape[0], self.group
        kg, cg = k // groups, c // groups
        out_h, out_w, th, tw = self._layout(x.shape)
        alpha, m = self.m + 2, self.m
        if gb is not None:
            gb += gy.sum(axis=(0, 2, 3))
        compiled = self._compiled(xp)
        dM = self._gradient_transform(gy, at, th, tw, compiled)  # (a, a, K, P)
        if gW is not None:
            V = self._input_transform(x, bt, compiled)
            dU = xp.empty((alpha, alpha, k, cg), dtype=gy.dtype)
            for q in range(groups):
                matmul(dM[:, :, q * kg:(q + 1) * kg], V[:, :, q * cg:(q + 1) * cg].swapaxes(2, 3),
                       out=dU[:, :, q * kg:(q + 1) * kg])
            self._add_filter_gradient(dU, g, gW, compiled)
            del V  # dV takes its place below
        if gx is None:
            return
        U = self._filter_transform(W, g, compiled)
        dV = xp.empty((alpha, alpha, c, dM.shape[-1]), dtype=gy.dtype)
        for q in range(groups):
            matmul(U[:, :, q * kg:(q + 1) * kg].swapaxes(2, 3), dM[:, :, q * kg:(q + 1) * kg],
                   out=dV[:, :, q * cg:(q + 1) * cg])
        ph, pw = self.geometry[4:6]
        if compiled:
            dV = dV.reshape(16, c, n, th, tw)
            into_contiguous(gx, lambda target: parallel_for(
                c, lambda lo, hi: _f2_scatter_input_grad(dV, ph, pw, lo, hi, target), work=gx.size))
            return
        dd = self._to_tiles(dV, bt.T, bt).reshape(alpha, alpha, c, n, th, tw)
        gpad = xp.zeros((n, c, th * m + 2, tw * m + 2), dtype=gy.dtype)
        for i in range(alpha):
            for j in range(alpha):
                gpad[:, :, i:i + th * m:m, j:j + tw * m:m] += dd[i, j].transpose(1, 0, 2, 3)
        rows, cols = min(h, th * m + 2 - ph), min(w, tw * m + 2 - pw)
        gx[...] = 0
        gx[:, :, :rows, :cols] = gpad[:, :, ph:ph + rows, pw:pw + cols]


class WinogradF4Conv(WinogradConv):
    """``engine: WINOGRAD``: F(4x4, 3x3), 4x fewer multiplications than direct convolution."""

    def __init__(self, geometry, group):
        super().__init__(geometry, group, 4)


class WinogradF2Conv(WinogradConv):
    """``engine: WINOGRAD_F2``: F(2x2, 3x3), 2.25x fewer multiplications, rounding as direct convolution's."""

    def __init__(self, geometry, group):
        super().__init__(geometry, group, 2)


# F(2x2, 3x3) on the CPU: B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], A^T = [[1, 1, 1, 0],
# [0, 1, -1, -1]], written out. Arrays of transformed tiles are (16, C or K, N, th, tw), position i * 4 + j.

# the two non-zeros of each row of B^T: (column, sign, column, sign)
_F2_BT_ROWS = ((0, 1.0, 2, -1.0), (1, 1.0, 2, 1.0), (1, -1.0, 2, 1.0), (1, 1.0, 3, -1.0))


@cpu_kernel
def _f2_tiles(x, ph, pw, rows_of, lo, hi, out):
    """out[4 i + j, c, image] = (L d L^T)[i, j] for every 4 x 4 tile d of each plane of x (N, C, H, W) placed
    at (ph, pw) in a zero plane, tiles at stride 2; ``rows_of`` gives the two non-zeros of each row of L as
    (column, sign, column, sign): B^T for the input tiles, A for the gradient tiles."""
    n, _, h, w = x.shape
    _, _, _, th, tw = out.shape
    plane = numpy.zeros((2 * th + 2, 2 * tw + 2), dtype=x.dtype)  # one zero-padded (image, channel) plane
    rows, cols = min(h, 2 * th + 2 - ph), min(w, 2 * tw + 2 - pw)
    for c in range(lo, hi):
        for b in range(n):
            plane[ph:ph + rows, pw:pw + cols] = x[b, c, :rows, :cols]
            for i in range(4):
                ra, sa, rb, sb = rows_of[i]
                for j in range(4):
                    ca, ta, cb, tb = rows_of[j]
                    dst = out[4 * i + j, c, b]
                    for ty in range(th):
                        top, bottom = plane[2 * ty + ra], plane[2 * ty + rb]
                        for tx in range(tw):
                            q = 2 * tx
                            dst[ty, tx] = sa * (ta * top[q + ca] + tb * top[q + cb]) + \
                                sb * (ta * bottom[q + ca] + tb * bottom[q + cb])


@cpu_kernel
def _f2_output_tiles_body(M, has_bias, bias, lo, hi, y):
    _, _, n, th, tw = M.shape
    out_h, out_w = y.shape[2], y.shape[3]
    plane = numpy.empty((2 * th, 2 * tw), dtype=M.dtype)  # whole tiles; the part past the output is cut off
    for k in range(lo, hi):
        add = bias[k] if has_bias else 0
        for b in range(n):
            m = M[:, k, b]
            for ty in range(th):
                upper, lower = plane[2 * ty], plane[2 * ty + 1]
                for tx in range(tw):
                    # s = A^T m (rows), then y = s A (columns)
                    s0 = m[0, ty, tx] + m[4, ty, tx] + m[8, ty, tx]
                    s1 = m[1, ty, tx] + m[5, ty, tx] + m[9, ty, tx]
                    s2 = m[2, ty, tx] + m[6, ty, tx] + m[10, ty, tx]
                    s3 = m[3, ty, tx] + m[7, ty, tx] + m[11, ty, tx]
                    upper[2 * tx] = s0 + s1 + s2 + add
                    upper[2 * tx + 1] = s1 - s2 - s3 + add
                    s0 = m[4, ty, tx] - m[8, ty, tx] - m[12, ty, tx]
                    s1 = m[5, ty, tx] - m[9, ty, tx] - m[13, ty, tx]
                    s2 = m[6, ty, tx] - m[10, ty, tx] - m[14, ty, tx]
                    s3 = m[7, ty, tx] - m[11, ty, tx] - m[15, ty, tx]
                    lower[2 * tx] = s0 + s1 + s2 + add
                    lower[2 * tx + 1] = s1 - s2 - s3 + add
            y[b, k] = plane[:out_h, :out_w]


def _f2_output_tiles(M, b, y):
    has_bias = b is not None
    bias = numpy.ascontiguousarray(b if has_bias else numpy.zeros(1), dtype=M.dtype)
    into_contiguous(y, lambda target: parallel_for(
        M.shape[1], lambda lo, hi: _f2_output_tiles_body(M, has_bias, bias, lo, hi, target), work=y.size))


# the non-zeros of each row of A: (index, sign) x 2 (a zero sign where the row has one)
_F2_A_ROWS = ((0, 1.0, 1, 0.0), (0, 1.0, 1, 1.0), (0, 1.0, 1, -1.0), (0, 0.0, 1, -1.0))


@cpu_kernel
def _f2_scatter_input_grad(dV, ph, pw, lo, hi, gx):
    _, _, n, th, tw = dV.shape
    h, w = gx.shape[2], gx.shape[3]
    plane = numpy.empty((2 * th + 2, 2 * tw + 2), dtype=dV.dtype)  # the padded gx plane the tiles add into
    e = numpy.empty((4, 4), dtype=dV.dtype)
    rows, cols = min(h, 2 * th + 2 - ph), min(w, 2 * tw + 2 - pw)
    for c in range(lo, hi):
        for b in range(n):
            plane[:] = 0
            v = dV[:, c, b]
            for ty in range(th):
                for tx in range(tw):
                    for j in range(4):  # e = B v (columns of B^T: 0 | 1 -2 +3 | -0 +1 +2 | -3)
                        v0, v1, v2, v3 = v[j, ty, tx], v[4 + j, ty, tx], v[8 + j, ty, tx], v[12 + j, ty, tx]
                        e[0, j] = v0
                        e[1, j] = v1 - v2 + v3
                        e[2, j] = v1 + v2 - v0
                        e[3, j] = -v3
                    for i in range(4):  # tile e B^T, added at (2 ty + i, 2 tx + j)
                        dst = plane[2 * ty + i]
                        q = 2 * tx
                        e0, e1, e2, e3 = e[i, 0], e[i, 1], e[i, 2], e[i, 3]
                        dst[q] += e0
                        dst[q + 1] += e1 - e2 + e3
                        dst[q + 2] += e1 + e2 - e0
                        dst[q + 3] -= e3
            gx[b, c] = 0
            gx[b, c, :rows, :cols] = plane[ph:ph + rows, pw:pw + cols]


@cpu_kernel
def _f2_filter_tiles(W, lo, hi, U):
    # U = G w G^T, G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]
    _, cg, _, _ = W.shape
    t = numpy.empty((4, 3), dtype=W.dtype)
    for k in range(lo, hi):
        for c in range(cg):
            w = W[k, c]
            for j in range(3):  # t = G w
                t[0, j] = w[0, j]
                t[1, j] = 0.5 * (w[0, j] + w[1, j] + w[2, j])
                t[2, j] = 0.5 * (w[0, j] - w[1, j] + w[2, j])
                t[3, j] = w[2, j]
            for i in range(4):  # U = t G^T
                U[4 * i, k, c] = t[i, 0]
                U[4 * i + 1, k, c] = 0.5 * (t[i, 0] + t[i, 1] + t[i, 2])
                U[4 * i + 2, k, c] = 0.5 * (t[i, 0] - t[i, 1] + t[i, 2])
                U[4 * i + 3, k, c] = t[i, 2]


@cpu_kernel
def _f2_filter_gradient(dU, lo, hi, gW):
    # gW += G^T dU G, the adjoint of _f2_filter_tiles
    _, _, cg = dU.shape
    e = numpy.empty((3, 4), dtype=dU.dtype)
    for k in range(lo, hi):
        for c in range(cg):
            for j in range(4):  # e = G^T dU
                d0, d1, d2, d3 = dU[j, k, c], dU[4 + j, k, c], dU[8 + j, k, c], dU[12 + j, k, c]
                e[0, j] = d0 + 0.5 * (d1 + d2)
                e[1, j] = 0.5 * (d1 - d2)
                e[2, j] = 0.5 * (d1 + d2) + d3
            for i in range(3):  # gW += e G
                gW[k, c, i, 0] += e[i, 0] + 0.5 * (e[i, 1] + e[i, 2])
                gW[k, c, i, 1] += 0.5 * (e[i, 1] - e[i, 2])
                gW[k, c, i, 2] += 0.5 * (e[i, 1] + e[i, 2]) + e[i, 3]
