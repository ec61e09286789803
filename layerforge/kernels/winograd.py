"""Winograd convolution F(m x m, r x r) for stride-1 layers (Lavin & Gray 2016): F(2x2, 3x3) and F(4x4, 3x3) for
3x3 filters, F(2x2, 5x5) for 5x5 ones; forward, data and filter gradients, numpy or cupy through ``xp``. A strided
layer whose kernel spans r x r strides (AlexNet's 11 x 11 at stride 4: 3 x 3) runs as the stride-1 convolution of its
space-to-depth blocks (kernels.space_to_depth).

The output is cut into m x m tiles; each reads an alpha x alpha input tile (alpha = m + r - 1, tiles overlapping
by r - 1). With B, G, A the transforms of the tile and filter sizes::

    V = B^T d B   (input tile),   U = G g G^T   (filter),   y_tile = A^T [ sum_c U[k, c] * V[c] ] A

The sum over input channels at each of the alpha^2 tile positions is one GEMM (K x C) @ (C x tiles), batched
over the positions: alpha^2 GEMMs of C K tiles multiply-adds against r^2 m^2 in direct convolution, 2.25x
fewer for F(2,3), 4x for F(4,3) and 2.78x for F(2,5). The gradients are the exact adjoints of that computation:

    dM = A gy_tile A^T,   dU = sum_tiles dM V^T  ->  gW = G^T dU G,   dV = U^T dM  ->  gx tiles = B dV B^T

(the overlapping gx tiles add up). On the CPU, the transforms of both tile sizes (input tiles, output tiles,
gradient tiles, the filters and their gradient, and the gx scatter) are compiled loops over channels on the
kernel threads (kernels.threadpool): the tiles are transformed in two passes, down the plane rows of a tile row
(every column at once) and then along each transformed row, a handful of adds per value in registers, where the
``xp`` path (cupy) copies every tile position out strided and runs small GEMMs over all tiles. The products of
the alpha^2 tile positions are split over the kernel threads (:func:`_position_products`). Float rounding grows with
alpha: the transforms of F(4,3) and F(2,5) (alpha 6, the same points 0, +-1, +-2, infinity and so the same B^T) have
entries up to 5 and 1/24 (F(2,5)'s G up to 2/3), F(2,3)'s only 0, +-1/2, 1; docs/performance.md has the measured
float32 error of each against a float64 direct convolution (F(4,3)'s is 10-20x direct convolution's, F(2,3)'s about
the same as direct's).
"""
import math
import time

import numpy

from ..backend import get_array_module
from .blas import batch_invariant, matmul, one_blas_thread
from .output_size import conv_output_size
from .space_to_depth import SpaceToDepth, block_kernel
from .threadpool import cpu_kernel, into_contiguous, num_threads, parallel_for
from .workspace import arena

# (B^T, G, A^T) of F(m x m, r x r), keyed (m, r)
_SIX_POINTS_BT = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                  [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]  # the points 0, 1, -1, 2, -2 and infinity
TRANSFORMS = {
    (2, 3): ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    (4, 3): (_SIX_POINTS_BT,
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
         [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
    # G's rows: the scale of each point's row of F(4,3)'s G (fixed by B^T) times (1, p, p^2, p^3, p^4)
    (2, 5): (_SIX_POINTS_BT,
             [[1 / 4, 0, 0, 0, 0], [-1 / 6] * 5, [-1 / 6, 1 / 6, -1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6, 1 / 3, 2 / 3], [1 / 24, -1 / 12, 1 / 6, -1 / 3, 2 / 3], [0, 0, 0, 0, 1]],
             [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 1]]),
}


def workspace_estimate(x_shape, out_channels, geometry, tile, itemsize, compiled=False):
    """Bytes a call holds at its peak, for input (N, C, H, W) and ``out_channels`` filters: the input tiles and
    their transform (and its transposed copies), the products and the output tiles; with ``compiled`` (the CPU,
    whose loops write the transforms straight from and into the images) one transformed array of each side,
    input and output."""
    blocks = 0
    if tuple(geometry[2:4]) != (1, 1):  # the stride-1 convolution over space-to-depth blocks, and the blocks
        depth = SpaceToDepth(geometry)
        x_shape, geometry = depth.blocks(x_shape), depth.geometry
        blocks = math.prod(x_shape) * itemsize
    n, c, h, w = x_shape
    r, ph, pw = geometry[0], geometry[4], geometry[5]
    out_h, out_w = conv_output_size(h, r, 1, ph), conv_output_size(w, r, 1, pw)
    tiles = n * -(-out_h // tile) * -(-out_w // tile)
    if compiled:
        return (tile + r - 1) ** 2 * tiles * (c + out_channels) * itemsize + blocks
    return (tile + r - 1) ** 2 * tiles * (3 * c + 2 * out_channels) * itemsize + blocks


# the most bytes of transformed tiles one call holds (workspace_estimate): a larger batch runs in chunks of images,
# each a whole call on its own tiles (an image's tiles and sums are the same whichever chunk holds it); AUTO's
# workspace limit for the GEMM engines' columns (autotune.AUTO_WORKSPACE_LIMIT), so one VGG image at 224 x 224 fits
CHUNK_BYTES = 64 << 20


def kernel_sizes(tile):
    """The filter sizes r that F(tile x tile, r x r) is defined for here (3 for tile 4; 3 and 5 for tile 2)."""
    return sorted(r for m, r in TRANSFORMS if m == tile)


def eligible(geometry, tile):
    """Whether a convolution ``(kh, kw, sy, sx, ph, pw, dy, dx)`` can run as Winograd F(tile x tile, r x r),
    undilated with any padding: at stride 1 a square r x r filter with r in :func:`kernel_sizes`; at a larger
    stride one that spans r x r strides (``ceil(kh / sy) = ceil(kw / sx) = r``, AlexNet's 11 x 11 at stride 4 for
    r = 3), run over space-to-depth blocks (kernels.space_to_depth)."""
    rh, rw = block_kernel(geometry)
    return rh == rw and (tile, rh) in TRANSFORMS and tuple(geometry[6:8]) == (1, 1)


class WinogradConv:
    """The engine: ``forward`` / ``backward`` as the GEMM engines of kernels.implicit_gemm (same arguments).

    An image's result is computed from its own tiles alone, each tile position's sum over channels one BLAS
    product over the tiles of the call: where every column gets the same bits whatever the others (numpy under
    ``blas.batch_invariant``: OpenBLAS's large path or kernels/thin_gemm.py) the result of an image is the same in
    any batch and any chunk; with cuBLAS it is not (``batch_invariant = False``, the flag of an engine that is
    invariant with any BLAS). A batch whose tiles exceed :data:`CHUNK_BYTES` runs in chunks of images.

    Args:
        geometry: ``(kh, kw, sy, sx, ph, pw, dy, dx)``, which must be :func:`eligible` for ``tile``; a strided one
            runs as the stride-1 convolution of its space-to-depth blocks (:attr:`depth`, :attr:`tile_geometry`).
        group: convolution groups.
        tile: output tile size m (2 or 4; 2 only for 5x5 filters).
    """

    batch_invariant = False
    keeps_input_tiles = True  # forward(..., keep=True): autotune.ConvEngines.run

    def __init__(self, geometry, group, tile=4):
        if not eligible(geometry, tile):
            sizes = " or ".join(f"{r}x{r}" for r in kernel_sizes(tile)) or "no"
            raise ValueError(f"Winograd F({tile}) needs an undilated convolution whose kernel spans {sizes} strides, "
                             f"got geometry {geometry}")
        self.geometry, self.group, self.m = tuple(geometry), group, tile
        self.depth = SpaceToDepth(geometry) if tuple(geometry[2:4]) != (1, 1) else None
        self.tile_geometry = self.depth.geometry if self.depth else self.geometry  # the stride-1 one the tiles run
        self.r = self.tile_geometry[0]
        self.alpha = tile + self.r - 1  # the input tile's side
        self.name = f"WINOGRAD_F{tile}" if tile != 4 else "WINOGRAD"
        self._bytes = 0
        # (the identities of x and W, the input tiles V, the transformed filters U) that forward kept for backward
        self.kept = None
        # seconds the last backward on the host spent deriving again what a kept forward would have handed it (the
        # input tiles and the transformed filters); autotune's choice weighs a backward after its own forward by it
        self.rederived_seconds = None
        self._own_tiles = None  # the array forward keeps them in, reused pass after pass

    @property
    def workspace_bytes(self):
        """Bytes of the transformed tiles of the last call (V, M and the padded input)."""
        return self._bytes

    @property
    def kept_bytes(self):
        """Bytes of what forward keeps for backward (``forward(..., keep=True)``): the array of the input tiles,
        reused pass after pass, and the transformed filters while kept."""
        return (0 if self._own_tiles is None else int(self._own_tiles.nbytes)) + (
            0 if self.kept is None else int(self.kept[2].nbytes))

    def release(self):
        self._bytes, self.kept, self._own_tiles = 0, None, None

    def _matrices(self, xp, dtype):
        bt, g, at = (xp.asarray(numpy.array(t, dtype=numpy.float64), dtype=dtype) for t in TRANSFORMS[self.m, self.r])
        return bt, g, at

    def _layout(self, x_shape):
        n, c, h, w = x_shape
        ph, pw = self.tile_geometry[4:6]
        out_h, out_w = conv_output_size(h, self.r, 1, ph), conv_output_size(w, self.r, 1, pw)
        th, tw = -(-out_h // self.m), -(-out_w // self.m)
        return out_h, out_w, th, tw

    def _tiles(self, x, dtype):
        """Input tiles (alpha, alpha, C, N th tw) of the zero-padded x, and the layout."""
        xp = get_array_module(x)
        n, c, h, w = x.shape
        ph, pw = self.tile_geometry[4:6]
        out_h, out_w, th, tw = self._layout(x.shape)
        alpha, edge = self.alpha, self.r - 1
        xpad = xp.zeros((n, c, th * self.m + edge, tw * self.m + edge), dtype=dtype)
        xpad[:, :, ph:ph + min(h, th * self.m + edge - ph), pw:pw + min(w, tw * self.m + edge - pw)] = \
            x[:, :, :th * self.m + edge - ph, :tw * self.m + edge - pw]
        d = xp.empty((alpha, alpha, c, n, th, tw), dtype=dtype)
        for i in range(alpha):
            for j in range(alpha):
                d[i, j] = xpad[:, :, i:i + th * self.m:self.m, j:j + tw * self.m:self.m].transpose(1, 0, 2, 3)
        self._bytes = d.nbytes + xpad.nbytes
        return d.reshape(alpha, alpha, c, n * th * tw)

    def _compiled(self, xp):
        # numpy arrays: the compiled transforms below (module docstring)
        return xp is numpy

    @staticmethod
    def _scratch(xp, role, shape, dtype, compiled):
        """An uninitialised array for one call: on the host a view of the shared arena of ``role`` (the input-side
        tiles in IMPLICIT's "col", the output side's in its "y"; kernels.workspace), whose pages are not faulted in
        again each call; on a device a new one from cupy's pool."""
        if compiled:
            return arena(xp, role, shape, numpy.dtype(dtype))
        return xp.empty(shape, dtype=dtype)

    def _filter_transform(self, W, g, compiled):
        """U = G w G^T of every filter, (a, a, K, C/G)."""
        if not compiled:
            return self._to_tiles(W.transpose(2, 3, 0, 1), g, g.T)
        alpha = self.alpha
        k, cg = W.shape[:2]
        W = numpy.ascontiguousarray(W)
        U = numpy.empty((alpha * alpha, k, cg), dtype=W.dtype)
        kernel = _COMPILED[self.m, self.r]["filter"]
        parallel_for(k, lambda lo, hi: kernel(W, lo, hi, U), work=U.size)
        return U.reshape(alpha, alpha, k, cg)

    def _add_filter_gradient(self, dU, g, gW, compiled):
        """gW += G^T dU G for every filter, dU (a, a, K, C/G)."""
        if not compiled:
            gW += self._to_tiles(dU, g.T, g).transpose(2, 3, 0, 1)
            return
        k, cg = dU.shape[2:]
        kernel = _COMPILED[self.m, self.r]["filter_gradient"]
        parallel_for(k, lambda lo, hi: kernel(dU.reshape(-1, k, cg), lo, hi, gW), work=gW.size)

    def _input_transform(self, x, bt, compiled, own=False):
        """V = B^T d B of every input tile, (a, a, C, P); ``own``: in an array of its own (else, on the host, in the
        shared arena)."""
        if not compiled:
            return self._to_tiles(self._tiles(x, x.dtype), bt, bt.T)
        alpha = self.alpha
        n, c, h, w = x.shape
        _, _, th, tw = self._layout(x.shape)
        x = numpy.ascontiguousarray(x)
        shape = (alpha * alpha, c, n, th, tw)
        if not own:
            V = arena(numpy, "col", shape, x.dtype)
        else:  # an array of the engine's own, whose pages are not faulted in again each pass
            if self._own_tiles is None or self._own_tiles.shape != shape or self._own_tiles.dtype != x.dtype:
                self._own_tiles = numpy.empty(shape, x.dtype)
            V = self._own_tiles
        ph, pw = self.tile_geometry[4:6]
        kernel = _COMPILED[self.m, self.r]["input"]
        # work: every transformed value is written (a 28 x 28 layer of 128 channels at batch 8 has 50K input values,
        # under MIN_PARALLEL_ELEMENTS, and 1.8M transformed: counted by the input, it ran on one thread)
        parallel_for(c, lambda lo, hi: kernel(x, ph, pw, lo, hi, V), work=V.size)
        self._bytes = V.nbytes
        return V.reshape(alpha, alpha, c, n * th * tw)

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
        alpha = self.alpha
        gy = numpy.ascontiguousarray(gy)
        dM = arena(numpy, "y", (alpha * alpha, k, n, th, tw), gy.dtype)
        kernel = _COMPILED[self.m, self.r]["gradient"]
        parallel_for(k, lambda lo, hi: kernel(gy, lo, hi, dM), work=dM.size)  # (as the input transform's)
        return dM.reshape(alpha, alpha, k, n * th * tw)

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

    def _chunks(self, x, out_channels, compiled):
        """``[(lo, hi), ...]``: the images of each call, as many as fit in :data:`CHUNK_BYTES` (at least one)."""
        n = x.shape[0]
        one = workspace_estimate((1,) + tuple(x.shape[1:]), out_channels, self.tile_geometry, self.m,
                                 x.dtype.itemsize, compiled=compiled)
        step = max(1, min(n, CHUNK_BYTES // max(one, 1)))
        return [(lo, min(n, lo + step)) for lo in range(0, n, step)]

    def forward(self, x, W, b, y, keep=False):
        """Write ``W * x (+ b)`` into ``y`` (N, Cout, out_h, out_w). ``keep``: hold the transformed input tiles and
        filters for the :meth:`backward` that follows with this x and W (a training pass, in which nothing changes
        them in between: Net.training_pass), which then need not transform x again for the filter gradient, nor W for
        the data gradient; where the batch is one chunk (:data:`CHUNK_BYTES`)."""
        self.kept = None
        key = (_identity(x), _identity(W)) if keep else None
        if self.depth is not None:
            x, W = self.depth.images(x), self.depth.filters(W)
        xp = get_array_module(x)
        bt, g, at = self._matrices(xp, x.dtype)
        compiled = self._compiled(xp)
        U = self._filter_transform(W, g, compiled)  # (a, a, K, C/G)
        chunks = self._chunks(x, W.shape[0], compiled)
        keep = keep and len(chunks) == 1
        for lo, hi in chunks:
            V = self._forward_images(x[lo:hi], U, b, y[lo:hi], bt, at, compiled, keep)
        if keep:
            self.kept = (key, V, U)
        if self.depth is not None:
            self._bytes += x.nbytes

    def _forward_images(self, x, U, b, y, bt, at, compiled, own=False):
        """y of the images x from the transformed filters U; returns the input tiles V (``own``: an array of their
        own, else on the host the shared arena's)."""
        xp = get_array_module(x)
        n, c = x.shape[:2]
        k, groups = U.shape[2], self.group
        out_h, out_w, th, tw = self._layout(x.shape)
        alpha, m = self.alpha, self.m
        V = self._input_transform(x, bt, compiled, own)  # (a, a, C, P)
        kg, cg = k // groups, c // groups
        M = self._scratch(xp, "y", (alpha, alpha, k, V.shape[-1]), x.dtype, compiled)
        for q in range(groups):
            _position_products(U[:, :, q * kg:(q + 1) * kg], V[:, :, q * cg:(q + 1) * cg],
                               M[:, :, q * kg:(q + 1) * kg])
        self._bytes += M.nbytes
        if compiled:
            _output_tiles(_COMPILED[m, self.r]["output"], M.reshape(alpha * alpha, k, n, th, tw), b, y)
            return V
        Y = self._to_tiles(M, at, at.T).reshape(m, m, k, n, th, tw)  # (m, m, K, N, th, tw)
        full = Y.transpose(3, 2, 4, 0, 5, 1).reshape(n, k, th * m, tw * m)
        if b is None:
            y[...] = full[:, :, :out_h, :out_w]
        else:
            xp.add(full[:, :, :out_h, :out_w], b[None, :, None, None], out=y)
        return V

    def backward(self, x, W, gy, gW, gb, gx, add_gx=False):
        """Add the filter (and bias) gradients into ``gW`` (``gb``); write the data gradient into ``gx`` (``add_gx``:
        add it to what ``gx`` holds). Any of them may be None (not wanted). The input tiles and filters that forward
        kept for this x and W serve the gradients."""
        kept, self.kept = self.kept, None
        if kept is None or kept[0] != (_identity(x), _identity(W)):
            kept = (None, None, None)
        V, U = kept[1:]
        if self.depth is None:
            return self._backward(x, W, gy, gW, gb, gx, V, U, add_gx)
        xp, depth = get_array_module(gy), self.depth
        xs, Ws = depth.images(x), depth.filters(W)
        gWs = xp.zeros_like(Ws) if gW is not None else None
        gxs = xp.empty_like(xs) if gx is not None else None
        self._backward(xs, Ws, gy, gWs, gb, gxs, V, U)
        if gW is not None:
            depth.add_filter_gradient(gWs, gW)
        if gx is not None:
            if add_gx:  # the blocks' gradient goes to every pixel: made whole, then added
                whole = xp.empty_like(gx)
                depth.image_gradient(gxs, whole)
                gx += whole
            else:
                depth.image_gradient(gxs, gx)

    def _backward(self, x, W, gy, gW, gb, gx, V=None, U=None, add_gx=False):
        xp = get_array_module(gy)
        bt, g, at = self._matrices(xp, gy.dtype)
        k, groups = W.shape[0], self.group
        c, kg, cg = x.shape[1], k // groups, W.shape[1]
        alpha = self.alpha
        _, _, th, tw = self._layout(x.shape)
        if gb is not None:
            gb += gy.sum(axis=(0, 2, 3))
        compiled = self._compiled(xp)
        dU = xp.empty((alpha, alpha, k, cg), dtype=gy.dtype) if gW is not None else None
        part = None  # a later chunk's dU, added to the first's (U: the transformed filters, made once for gx)
        chunks = self._chunks(x, k, compiled)
        rederived = 0.0  # (timed on the host only, where the clock times the transforms themselves)
        for i, (lo, hi) in enumerate(chunks):
            dM = self._gradient_transform(gy[lo:hi], at, th, tw, compiled)  # (a, a, K, P)
            if gW is not None:
                if V is None or i:  # (forward keeps the tiles of a batch of one chunk only)
                    start = time.perf_counter()
                    V = self._input_transform(x[lo:hi], bt, compiled)
                    rederived += time.perf_counter() - start
                if i and part is None:
                    part = xp.empty_like(dU)
                into = part if i else dU
                for q in range(groups):
                    _position_products(dM[:, :, q * kg:(q + 1) * kg], V[:, :, q * cg:(q + 1) * cg].swapaxes(2, 3),
                                       into[:, :, q * kg:(q + 1) * kg])
                if i:
                    dU += part
            if gx is None:
                continue
            if U is None:
                start = time.perf_counter()
                U = self._filter_transform(W, g, compiled)
                rederived += time.perf_counter() - start
            dV = self._scratch(xp, "col", (alpha, alpha, c, dM.shape[-1]), gy.dtype, compiled)  # V's place
            for q in range(groups):
                _position_products(U[:, :, q * kg:(q + 1) * kg].swapaxes(2, 3), dM[:, :, q * kg:(q + 1) * kg],
                                   dV[:, :, q * cg:(q + 1) * cg])
            self._scatter_input_gradient(dV, gx[lo:hi], th, tw, bt, compiled, add_gx)
        if gW is not None:
            self._add_filter_gradient(dU, g, gW, compiled)
        self.rederived_seconds = (rederived if len(chunks) == 1 else 0.0) if compiled else None

    def _scatter_input_gradient(self, dV, gx, th, tw, bt, compiled, add=False):
        """Write gx (``add``: add to gx) the sum of B dV B^T over the overlapping input tiles (dV: (a, a, C, N th
        tw))."""
        alpha, m, edge = self.alpha, self.m, self.r - 1
        n, c, h, w = gx.shape
        ph, pw = self.tile_geometry[4:6]
        if add and compiled and not gx.flags.c_contiguous:  # the kernels add into a contiguous array only
            whole = numpy.empty(gx.shape, gx.dtype)
            self._scatter_input_gradient(dV, whole, th, tw, bt, compiled)
            gx += whole
            return
        if compiled:
            dV, scatter = dV.reshape(alpha * alpha, c, n, th, tw), _COMPILED[m, self.r]["scatter"]
            into_contiguous(gx, lambda target: parallel_for(
                c, lambda lo, hi: scatter(dV, ph, pw, add, lo, hi, target), work=gx.size))
            return
        xp = get_array_module(dV)
        dd = self._to_tiles(dV, bt.T, bt).reshape(alpha, alpha, c, n, th, tw)
        gpad = xp.zeros((n, c, th * m + edge, tw * m + edge), dtype=dV.dtype)
        for i in range(alpha):
            for j in range(alpha):
                gpad[:, :, i:i + th * m:m, j:j + tw * m:m] += dd[i, j].transpose(1, 0, 2, 3)
        rows, cols = min(h, th * m + edge - ph), min(w, tw * m + edge - pw)
        if add:
            gx[:, :, :rows, :cols] += gpad[:, :, ph:ph + rows, pw:pw + cols]
            return
        gx[...] = 0
        gx[:, :, :rows, :cols] = gpad[:, :, ph:ph + rows, pw:pw + cols]


def _identity(x):
    """Where x's values are and how they are laid out: forward's tiles serve backward for the same array only."""
    pointer = x.ctypes.data if isinstance(x, numpy.ndarray) else x.data.ptr
    return pointer, x.shape, x.strides, x.dtype


def _position_products(a, b, out):
    """``out[i, j] = a[i, j] @ b[i, j]`` for every tile position (i, j).

    On numpy with several kernel threads the positions are split over the threads, each product on one BLAS
    thread (blas.one_blas_thread): alpha^2 products on 2 BLAS threads are alpha^2 barriers between them, and a
    thread descheduled by other work on the machine stretches each (F(4,3) forward + backward on 128 x 28 at batch 8,
    2 threads, load 15 on 2 cores: 2083 ms, 92 with the positions split; docs/performance.md). Each product is the
    same BLAS call either way (OpenBLAS splits a product's rows and columns over its threads, never its sums), so the
    results are too.
    """
    threads = num_threads() if isinstance(out, numpy.ndarray) else 1
    if threads <= 1 or not one_blas_thread().available or batch_invariant():
        matmul(a, b, out=out)  # under the switch: one stack, split by positions over the product threads (blas)
        return
    alpha = out.shape[1]

    def body(lo, hi):
        for p in range(lo, hi):
            matmul(a[p // alpha, p % alpha], b[p // alpha, p % alpha], out=out[p // alpha, p % alpha])
    with one_blas_thread():
        parallel_for(out.shape[0] * alpha, body, work=out.size)


class WinogradF4Conv(WinogradConv):
    """``engine: WINOGRAD``: F(4x4, 3x3), 4x fewer multiplications than direct convolution."""

    def __init__(self, geometry, group):
        super().__init__(geometry, group, 4)


class WinogradF2Conv(WinogradConv):
    """``engine: WINOGRAD_F2``: F(2x2, 3x3), 2.25x fewer multiplications, rounding as direct convolution's; on a 5x5
    layer F(2x2, 5x5), 2.78x fewer, rounding as F(4x4, 3x3)'s (the same input transform)."""

    def __init__(self, geometry, group):
        super().__init__(geometry, group, 2)


# F(2x2, 3x3) on the CPU: B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], A^T = [[1, 1, 1, 0],
# [0, 1, -1, -1]], written out. Arrays of transformed tiles are (16, C or K, N, th, tw), position i * 4 + j.

@cpu_kernel
def _f2_input_tiles(x, ph, pw, lo, hi, out):
    """out[4 i + j, c, image] = (B^T d B)[i, j] for every 4 x 4 tile d of each plane of x (N, C, H, W) placed at
    (ph, pw) in a zero plane, tiles at stride 2: B^T (rows d0 - d2 | d1 + d2 | d2 - d1 | d1 - d3) down the four
    plane rows of a tile row, every column at once, then along each transformed row, tile by tile."""
    n, _, h, w = x.shape
    _, _, _, th, tw = out.shape
    width = 2 * tw + 2
    plane = numpy.zeros((2 * th + 2, width), dtype=x.dtype)  # one zero-padded (image, channel) plane
    t = numpy.empty((4, width), dtype=x.dtype)
    rows, cols = min(h, 2 * th + 2 - ph), min(w, width - pw)
    for c in range(lo, hi):
        for b in range(n):
            plane[ph:ph + rows, pw:pw + cols] = x[b, c, :rows, :cols]
            for ty in range(th):
                p = plane[2 * ty:2 * ty + 4]
                for q in range(width):  # t = B^T d
                    d0, d1, d2, d3 = p[0, q], p[1, q], p[2, q], p[3, q]
                    t[0, q], t[1, q], t[2, q], t[3, q] = d0 - d2, d1 + d2, d2 - d1, d1 - d3
                for i in range(4):  # V = t B
                    r, dst = t[i], out[4 * i:4 * i + 4, c, b, ty]
                    for tx in range(tw):
                        q = 2 * tx
                        d0, d1, d2, d3 = r[q], r[q + 1], r[q + 2], r[q + 3]
                        dst[0, tx], dst[1, tx], dst[2, tx], dst[3, tx] = d0 - d2, d1 + d2, d2 - d1, d1 - d3


def _two_output_gradient_tiles(alpha):
    """The compiled gradient transform of F(2,3) (alpha 4) or F(2,5) (alpha 6): ``body(gy, lo, hi, out)`` writes
    out[alpha i + j, k, image] = (A g A^T)[i, j] for every 2 x 2 tile g of each plane of gy (N, K, out_h, out_w),
    zero-padded to whole tiles. A's rows, for (g0, g1): F(2,3)'s g0 | g0 + g1 | g0 - g1 | -g1, F(2,5)'s g0 | g0 + g1 |
    g0 - g1 | g0 + 2 g1 | g0 - 2 g1 | g1 (alpha a constant of each compiled body, as _six_point_input_tiles' m)."""
    @cpu_kernel
    def body(gy, lo, hi, out):
        n, _, h, w = gy.shape
        _, _, _, th, tw = out.shape
        two = numpy.float32(2)
        plane = numpy.zeros((2 * th, 2 * tw), dtype=gy.dtype)
        t = numpy.empty((alpha, 2 * tw), dtype=gy.dtype)
        for k in range(lo, hi):
            for b in range(n):
                plane[:h, :w] = gy[b, k]
                for ty in range(th):
                    for q in range(2 * tw):  # t = A g
                        g0, g1 = plane[2 * ty, q], plane[2 * ty + 1, q]
                        t[0, q], t[1, q], t[2, q] = g0, g0 + g1, g0 - g1
                        if alpha == 4:
                            t[3, q] = -g1
                        else:
                            t[3, q], t[4, q], t[5, q] = g0 + two * g1, g0 - two * g1, g1
                    for i in range(alpha):  # dM = t A^T
                        r, dst = t[i], out[alpha * i:alpha * i + alpha, k, b, ty]
                        for tx in range(tw):
                            g0, g1 = r[2 * tx], r[2 * tx + 1]
                            dst[0, tx], dst[1, tx], dst[2, tx] = g0, g0 + g1, g0 - g1
                            if alpha == 4:
                                dst[3, tx] = -g1
                            else:
                                dst[3, tx], dst[4, tx], dst[5, tx] = g0 + two * g1, g0 - two * g1, g1
    return body


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


def _output_tiles(body, M, b, y):
    """y = A^T m A (+ b) of every tile m of M (a^2, K, N, th, tw) by the compiled ``body``, cut to y's size."""
    has_bias = b is not None
    bias = numpy.ascontiguousarray(b if has_bias else numpy.zeros(1), dtype=M.dtype)
    into_contiguous(y, lambda target: parallel_for(
        M.shape[1], lambda lo, hi: body(M, has_bias, bias, lo, hi, target), work=y.size))


@cpu_kernel
def _f2_scatter_input_grad(dV, ph, pw, add, lo, hi, gx):
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
            if add:
                gx[b, c, :rows, :cols] += plane[ph:ph + rows, pw:pw + cols]
            else:
                gx[b, c] = 0
                gx[b, c, :rows, :cols] = plane[ph:ph + rows, pw:pw + cols]


@cpu_kernel
def _f2_filter_tiles(W, lo, hi, U):
    # U = G w G^T, G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]], over all input channels of a
    # filter at once (U's rows are written in order, not 16 of them a step apart)
    _, cg, _, _ = W.shape
    t = numpy.empty((4, 3, cg), dtype=W.dtype)
    for k in range(lo, hi):
        w = W[k]
        for j in range(3):  # t = G w
            for c in range(cg):
                t[0, j, c] = w[c, 0, j]
                t[1, j, c] = 0.5 * (w[c, 0, j] + w[c, 1, j] + w[c, 2, j])
                t[2, j, c] = 0.5 * (w[c, 0, j] - w[c, 1, j] + w[c, 2, j])
                t[3, j, c] = w[c, 2, j]
        for i in range(4):  # U = t G^T
            for c in range(cg):
                U[4 * i, k, c] = t[i, 0, c]
                U[4 * i + 1, k, c] = 0.5 * (t[i, 0, c] + t[i, 1, c] + t[i, 2, c])
                U[4 * i + 2, k, c] = 0.5 * (t[i, 0, c] - t[i, 1, c] + t[i, 2, c])
                U[4 * i + 3, k, c] = t[i, 2, c]


@cpu_kernel
def _f2_filter_gradient(dU, lo, hi, gW):
    # gW += G^T dU G, the adjoint of _f2_filter_tiles
    _, _, cg = dU.shape
    e = numpy.empty((3, 4, cg), dtype=dU.dtype)
    for k in range(lo, hi):
        for j in range(4):  # e = G^T dU
            for c in range(cg):
                d0, d1, d2, d3 = dU[j, k, c], dU[4 + j, k, c], dU[8 + j, k, c], dU[12 + j, k, c]
                e[0, j, c] = d0 + 0.5 * (d1 + d2)
                e[1, j, c] = 0.5 * (d1 - d2)
                e[2, j, c] = 0.5 * (d1 + d2) + d3
        g = gW[k]
        for i in range(3):  # gW += e G
            for c in range(cg):
                g[c, i, 0] += e[i, 0, c] + 0.5 * (e[i, 1, c] + e[i, 2, c])
                g[c, i, 1] += 0.5 * (e[i, 1, c] - e[i, 2, c])
                g[c, i, 2] += 0.5 * (e[i, 1, c] + e[i, 2, c]) + e[i, 3, c]


# F(4x4, 3x3) and F(2x2, 5x5) on the CPU: TRANSFORMS[4, 3] and [2, 5] written out, each side of a tile in two
# passes. Their input tiles share B^T (six points); its rows, for a column (d0 .. d5): 4 d0 - 5 d2 + d4 |
# d4 + d3 - 4 (d1 + d2) | d4 - d3 + 4 (d1 - d2) | d4 - d2 + 2 (d3 - d1) | d4 - d2 - 2 (d3 - d1) | 4 d1 - 5 d3 + d5;
# the tiles lie m apart (4 or 2). Arrays of transformed tiles are (36, C or K, N, th, tw), position 6 i + j. The
# integer coefficients are float32 constants, so float32 tiles are transformed in float32 (a float64 literal would
# widen every operation, at half the vector width).

def _six_point_input_tiles(m):
    """The compiled input transform of tiles m apart: ``body(x, ph, pw, lo, hi, out)`` writes out[6 i + j, c, image]
    = (B^T d B)[i, j] for every 6 x 6 tile d of each plane of x (N, C, H, W) placed at (ph, pw) in a zero plane, tiles
    at stride m: B^T down the six plane rows of a tile row (every column at once), then along each of the six
    transformed rows, tile by tile. (m is a constant of each compiled body: a variable stride ran F(4,3)'s 10-40%
    slower.)"""
    @cpu_kernel
    def body(x, ph, pw, lo, hi, out):
        n, _, h, w = x.shape
        _, _, _, th, tw = out.shape
        two, four, five = numpy.float32(2), numpy.float32(4), numpy.float32(5)
        width = m * tw + 6 - m
        plane = numpy.zeros((m * th + 6 - m, width), dtype=x.dtype)
        t = numpy.empty((6, width), dtype=x.dtype)
        rows, cols = min(h, m * th + 6 - m - ph), min(w, width - pw)
        for c in range(lo, hi):
            for b in range(n):
                plane[ph:ph + rows, pw:pw + cols] = x[b, c, :rows, :cols]
                for ty in range(th):
                    p = plane[m * ty:m * ty + 6]
                    for q in range(width):  # t = B^T d
                        d0, d1, d2, d3, d4, d5 = p[0, q], p[1, q], p[2, q], p[3, q], p[4, q], p[5, q]
                        t[0, q] = four * d0 - five * d2 + d4
                        t[1, q] = d4 + d3 - four * (d1 + d2)
                        t[2, q] = d4 - d3 + four * (d1 - d2)
                        t[3, q] = d4 - d2 + two * (d3 - d1)
                        t[4, q] = d4 - d2 - two * (d3 - d1)
                        t[5, q] = four * d1 - five * d3 + d5
                    for i in range(6):  # V = t B
                        r, dst = t[i], out[6 * i:6 * i + 6, c, b, ty]
                        for tx in range(tw):
                            q = m * tx
                            d0, d1, d2, d3, d4, d5 = r[q], r[q + 1], r[q + 2], r[q + 3], r[q + 4], r[q + 5]
                            dst[0, tx] = four * d0 - five * d2 + d4
                            dst[1, tx] = d4 + d3 - four * (d1 + d2)
                            dst[2, tx] = d4 - d3 + four * (d1 - d2)
                            dst[3, tx] = d4 - d2 + two * (d3 - d1)
                            dst[4, tx] = d4 - d2 - two * (d3 - d1)
                            dst[5, tx] = four * d1 - five * d3 + d5
    return body


@cpu_kernel
def _f4_gradient_tiles(gy, lo, hi, out):
    """out[6 i + j, k, image] = (A g A^T)[i, j] for every 4 x 4 tile g of each plane of gy (N, K, out_h, out_w),
    zero-padded to whole tiles; A's rows, for (g0 .. g3): g0 | e + o | e - o | e4 + o4 | e4 - o4 | g3 with
    e = g0 + g2, o = g1 + g3, e4 = g0 + 4 g2, o4 = 2 g1 + 8 g3."""
    n, _, h, w = gy.shape
    _, _, _, th, tw = out.shape
    two, four, eight = numpy.float32(2), numpy.float32(4), numpy.float32(8)
    plane = numpy.zeros((4 * th, 4 * tw), dtype=gy.dtype)
    t = numpy.empty((6, 4 * tw), dtype=gy.dtype)
    for k in range(lo, hi):
        for b in range(n):
            plane[:h, :w] = gy[b, k]
            for ty in range(th):
                p = plane[4 * ty:4 * ty + 4]
                for q in range(4 * tw):  # t = A g
                    g0, g1, g2, g3 = p[0, q], p[1, q], p[2, q], p[3, q]
                    e, o, e4, o4 = g0 + g2, g1 + g3, g0 + four * g2, two * g1 + eight * g3
                    t[0, q], t[1, q], t[2, q], t[3, q], t[4, q], t[5, q] = g0, e + o, e - o, e4 + o4, e4 - o4, g3
                for i in range(6):  # dM = t A^T
                    r, dst = t[i], out[6 * i:6 * i + 6, k, b, ty]
                    for tx in range(tw):
                        q = 4 * tx
                        g0, g1, g2, g3 = r[q], r[q + 1], r[q + 2], r[q + 3]
                        e, o, e4, o4 = g0 + g2, g1 + g3, g0 + four * g2, two * g1 + eight * g3
                        dst[0, tx], dst[1, tx], dst[2, tx] = g0, e + o, e - o
                        dst[3, tx], dst[4, tx], dst[5, tx] = e4 + o4, e4 - o4, g3


def _six_point_output_tiles(m):
    """The compiled output transform of F(4,3) (m 4) or F(2,5) (m 2): ``body(M, has_bias, bias, lo, hi, y)``, y =
    A^T v A (+ bias) of every tile v of M (36, K, N, th, tw), cut to y's size. A^T's rows, for (m0 .. m5), with s, d =
    m1 +- m2 and s4, d4 = m3 +- m4: F(4,3)'s m0 + s + s4 | d + 2 d4 | s + 4 s4 | d + 8 d4 + m5, F(2,5)'s m0 + s + s4 |
    d + 2 d4 + m5 (m a constant, as _six_point_input_tiles')."""
    @cpu_kernel
    def body(M, has_bias, bias, lo, hi, y):
        _, _, n, th, tw = M.shape
        out_h, out_w = y.shape[2], y.shape[3]
        two, four, eight = numpy.float32(2), numpy.float32(4), numpy.float32(8)
        plane = numpy.empty((m * th, m * tw), dtype=M.dtype)  # whole tiles; the part past the output is cut off
        u = numpy.empty((6, m * tw), dtype=M.dtype)
        for k in range(lo, hi):
            add = bias[k] if has_bias else bias[0]  # (a zero of M's type: a literal 0 would widen the adds)
            for b in range(n):
                v = M[:, k, b]
                for ty in range(th):
                    for i in range(6):  # u = v A
                        r = u[i]
                        for tx in range(tw):
                            m0, m1, m2 = v[6 * i, ty, tx], v[6 * i + 1, ty, tx], v[6 * i + 2, ty, tx]
                            m3, m4, m5 = v[6 * i + 3, ty, tx], v[6 * i + 4, ty, tx], v[6 * i + 5, ty, tx]
                            s, d, s4, d4 = m1 + m2, m1 - m2, m3 + m4, m3 - m4
                            q = m * tx
                            if m == 4:
                                r[q], r[q + 1], r[q + 2], r[q + 3] = m0 + s + s4, d + two * d4, s + four * s4, \
                                    d + eight * d4 + m5
                            else:
                                r[q], r[q + 1] = m0 + s + s4, d + two * d4 + m5
                    dst = plane[m * ty:m * ty + m]
                    for q in range(m * tw):  # y = A^T u
                        m0, m1, m2, m3, m4, m5 = u[0, q], u[1, q], u[2, q], u[3, q], u[4, q], u[5, q]
                        s, d, s4, d4 = m1 + m2, m1 - m2, m3 + m4, m3 - m4
                        dst[0, q] = m0 + s + s4 + add
                        if m == 4:
                            dst[1, q] = d + two * d4 + add
                            dst[2, q] = s + four * s4 + add
                            dst[3, q] = d + eight * d4 + m5 + add
                        else:
                            dst[1, q] = d + two * d4 + m5 + add
                y[b, k] = plane[:out_h, :out_w]
    return body


def _six_point_scatter_input_grad(m):
    """The compiled gx scatter of tiles m apart: ``body(dV, ph, pw, add, lo, hi, gx)`` writes gx (``add``: adds to gx)
    the sum of the tiles B v B^T of dV (36, C, N, th, tw) at stride m, cut at (ph, pw). B's rows (B^T's columns), for
    (v0 .. v5): 4 v0 | 2 d4 - 4 d + 4 v5 ... written out below with s, d = v1 +- v2 and s4, d4 = v3 +- v4; the six
    columns of each tile row are added into a strip first, then B down the strip's rows. (m a constant, as
    _six_point_input_tiles'.)"""
    @cpu_kernel
    def body(dV, ph, pw, add, lo, hi, gx):
        _, _, n, th, tw = dV.shape
        h, w = gx.shape[2], gx.shape[3]
        two, four, five = numpy.float32(2), numpy.float32(4), numpy.float32(5)
        width = m * tw + 6 - m
        plane = numpy.empty((m * th + 6 - m, width), dtype=dV.dtype)  # the padded gx plane the tiles add into
        f = numpy.empty((6, width), dtype=dV.dtype)
        rows, cols = min(h, m * th + 6 - m - ph), min(w, width - pw)
        for c in range(lo, hi):
            for b in range(n):
                plane[:] = 0
                v = dV[:, c, b]
                for ty in range(th):
                    f[:] = 0
                    for i in range(6):  # f = v B^T, overlapping tiles added
                        r = f[i]
                        for tx in range(tw):
                            v0, v1, v2 = v[6 * i, ty, tx], v[6 * i + 1, ty, tx], v[6 * i + 2, ty, tx]
                            v3, v4, v5 = v[6 * i + 3, ty, tx], v[6 * i + 4, ty, tx], v[6 * i + 5, ty, tx]
                            s, d, s4, d4 = v1 + v2, v1 - v2, v3 + v4, v3 - v4
                            q = m * tx
                            r[q] += four * v0
                            r[q + 1] += four * (v5 - d) - two * d4
                            r[q + 2] -= five * v0 + four * s + s4
                            r[q + 3] += d + two * d4 - five * v5
                            r[q + 4] += v0 + s + s4
                            r[q + 5] += v5
                    dst = plane[m * ty:m * ty + 6]
                    for q in range(width):  # B f, added at (m ty + i, q)
                        v0, v1, v2, v3, v4, v5 = f[0, q], f[1, q], f[2, q], f[3, q], f[4, q], f[5, q]
                        s, d, s4, d4 = v1 + v2, v1 - v2, v3 + v4, v3 - v4
                        dst[0, q] += four * v0
                        dst[1, q] += four * (v5 - d) - two * d4
                        dst[2, q] -= five * v0 + four * s + s4
                        dst[3, q] += d + two * d4 - five * v5
                        dst[4, q] += v0 + s + s4
                        dst[5, q] += v5
                if add:
                    gx[b, c, :rows, :cols] += plane[ph:ph + rows, pw:pw + cols]
                else:
                    gx[b, c] = 0
                    gx[b, c, :rows, :cols] = plane[ph:ph + rows, pw:pw + cols]
    return body


@cpu_kernel
def _f4_filter_tiles(W, lo, hi, U):
    # U = G w G^T, G's rows for (w0, w1, w2): w0 / 4 | -(w0 + w1 + w2) / 6 | -(w0 - w1 + w2) / 6 |
    # w0 / 24 + w1 / 12 + w2 / 6 | w0 / 24 - w1 / 12 + w2 / 6 | w2; in float64 (the filters are few), with the
    # reciprocals (a division costs several products), over all input channels of a filter at once (U's rows)
    _, cg, _, _ = W.shape
    sixth, twelfth, twentyfourth = 1.0 / 6.0, 1.0 / 12.0, 1.0 / 24.0
    t = numpy.empty((6, 3, cg))
    for k in range(lo, hi):
        w = W[k]
        for j in range(3):  # t = G w
            for c in range(cg):
                w0, w1, w2 = float(w[c, 0, j]), float(w[c, 1, j]), float(w[c, 2, j])
                e, o = w0 * twentyfourth + w2 * sixth, w1 * twelfth
                t[0, j, c], t[1, j, c], t[2, j, c] = 0.25 * w0, -(w0 + w1 + w2) * sixth, -(w0 - w1 + w2) * sixth
                t[3, j, c], t[4, j, c], t[5, j, c] = e + o, e - o, w2
        for i in range(6):  # U = t G^T
            for c in range(cg):
                w0, w1, w2 = t[i, 0, c], t[i, 1, c], t[i, 2, c]
                e, o = w0 * twentyfourth + w2 * sixth, w1 * twelfth
                U[6 * i, k, c], U[6 * i + 1, k, c] = 0.25 * w0, -(w0 + w1 + w2) * sixth
                U[6 * i + 2, k, c], U[6 * i + 3, k, c] = -(w0 - w1 + w2) * sixth, e + o
                U[6 * i + 4, k, c], U[6 * i + 5, k, c] = e - o, w2


@cpu_kernel
def _f4_filter_gradient(dU, lo, hi, gW):
    # gW += G^T dU G, the adjoint of _f4_filter_tiles; G^T's rows for (u0 .. u5): u0 / 4 - (u1 + u2) / 6 +
    # (u3 + u4) / 24 | (u2 - u1) / 6 + (u3 - u4) / 12 | (u3 + u4 - u1 - u2) / 6 + u5
    _, _, cg = dU.shape
    sixth, twelfth, twentyfourth = 1.0 / 6.0, 1.0 / 12.0, 1.0 / 24.0
    e = numpy.empty((3, 6, cg))
    for k in range(lo, hi):
        for j in range(6):  # e = G^T dU
            for c in range(cg):
                u0, u1, u2 = float(dU[j, k, c]), float(dU[6 + j, k, c]), float(dU[12 + j, k, c])
                u3, u4, u5 = float(dU[18 + j, k, c]), float(dU[24 + j, k, c]), float(dU[30 + j, k, c])
                e[0, j, c] = 0.25 * u0 - (u1 + u2) * sixth + (u3 + u4) * twentyfourth
                e[1, j, c] = (u2 - u1) * sixth + (u3 - u4) * twelfth
                e[2, j, c] = (u3 + u4 - u1 - u2) * sixth + u5
        g = gW[k]
        for i in range(3):  # gW += e G
            for c in range(cg):
                u0, u1, u2, u3, u4, u5 = e[i, 0, c], e[i, 1, c], e[i, 2, c], e[i, 3, c], e[i, 4, c], e[i, 5, c]
                g[c, i, 0] += 0.25 * u0 - (u1 + u2) * sixth + (u3 + u4) * twentyfourth
                g[c, i, 1] += (u2 - u1) * sixth + (u3 - u4) * twelfth
                g[c, i, 2] += (u3 + u4 - u1 - u2) * sixth + u5


@cpu_kernel
def _f25_filter_tiles(W, lo, hi, U):
    # U = G w G^T, F(2,5)'s G's rows for (w0 .. w4): w0 / 4 | -(e + o) / 6 | -(e - o) / 6 | (e4 + o4) / 24 |
    # (e4 - o4) / 24 | w4 with e = w0 + w2 + w4, o = w1 + w3, e4 = w0 + 4 w2 + 16 w4, o4 = 2 w1 + 8 w3; in float64
    # as F(4,3)'s
    _, cg, _, _ = W.shape
    sixth, twentyfourth = 1.0 / 6.0, 1.0 / 24.0
    t = numpy.empty((6, 5, cg))
    for k in range(lo, hi):
        w = W[k]
        for j in range(5):  # t = G w
            for c in range(cg):
                w0, w1, w2, w3, w4 = float(w[c, 0, j]), float(w[c, 1, j]), float(w[c, 2, j]), float(w[c, 3, j]), \
                    float(w[c, 4, j])
                e, o, e4, o4 = w0 + w2 + w4, w1 + w3, w0 + 4.0 * w2 + 16.0 * w4, 2.0 * w1 + 8.0 * w3
                t[0, j, c], t[1, j, c], t[2, j, c] = 0.25 * w0, -(e + o) * sixth, -(e - o) * sixth
                t[3, j, c], t[4, j, c], t[5, j, c] = (e4 + o4) * twentyfourth, (e4 - o4) * twentyfourth, w4
        for i in range(6):  # U = t G^T
            for c in range(cg):
                w0, w1, w2, w3, w4 = t[i, 0, c], t[i, 1, c], t[i, 2, c], t[i, 3, c], t[i, 4, c]
                e, o, e4, o4 = w0 + w2 + w4, w1 + w3, w0 + 4.0 * w2 + 16.0 * w4, 2.0 * w1 + 8.0 * w3
                U[6 * i, k, c], U[6 * i + 1, k, c], U[6 * i + 2, k, c] = 0.25 * w0, -(e + o) * sixth, -(e - o) * sixth
                U[6 * i + 3, k, c], U[6 * i + 4, k, c] = (e4 + o4) * twentyfourth, (e4 - o4) * twentyfourth
                U[6 * i + 5, k, c] = w4


@cpu_kernel
def _f25_filter_gradient(dU, lo, hi, gW):
    # gW += G^T dU G, the adjoint of _f25_filter_tiles; G^T's rows for (u0 .. u5), with s, d = u1 +- u2 and s4, d4 =
    # u3 +- u4: u0 / 4 - s / 6 + s4 / 24 | -d / 6 + d4 / 12 | -s / 6 + s4 / 6 | -d / 6 + d4 / 3 | -s / 6 + 2 s4 / 3 + u5
    _, _, cg = dU.shape
    sixth, twelfth, twentyfourth, third = 1.0 / 6.0, 1.0 / 12.0, 1.0 / 24.0, 1.0 / 3.0
    e = numpy.empty((5, 6, cg))
    for k in range(lo, hi):
        for j in range(6):  # e = G^T dU
            for c in range(cg):
                u0, u1, u2 = float(dU[j, k, c]), float(dU[6 + j, k, c]), float(dU[12 + j, k, c])
                u3, u4, u5 = float(dU[18 + j, k, c]), float(dU[24 + j, k, c]), float(dU[30 + j, k, c])
                s, d, s4, d4 = u1 + u2, u1 - u2, u3 + u4, u3 - u4
                e[0, j, c] = 0.25 * u0 - s * sixth + s4 * twentyfourth
                e[1, j, c] = d4 * twelfth - d * sixth
                e[2, j, c] = (s4 - s) * sixth
                e[3, j, c] = d4 * third - d * sixth
                e[4, j, c] = 2.0 * s4 * third - s * sixth + u5
        g = gW[k]
        for i in range(5):  # gW += e G
            for c in range(cg):
                u0, u1, u2, u3, u4, u5 = e[i, 0, c], e[i, 1, c], e[i, 2, c], e[i, 3, c], e[i, 4, c], e[i, 5, c]
                s, d, s4, d4 = u1 + u2, u1 - u2, u3 + u4, u3 - u4
                g[c, i, 0] += 0.25 * u0 - s * sixth + s4 * twentyfourth
                g[c, i, 1] += d4 * twelfth - d * sixth
                g[c, i, 2] += (s4 - s) * sixth
                g[c, i, 3] += d4 * third - d * sixth
                g[c, i, 4] += 2.0 * s4 * third - s * sixth + u5


# the compiled bodies per (tile size, filter size): the input and gradient tiles (x, ph, pw, lo, hi, out) and
# (gy, lo, hi, out), the output tiles, the gx scatter, the filters and their gradient
_COMPILED = {
    (2, 3): {"input": _f2_input_tiles, "gradient": _two_output_gradient_tiles(4), "filter": _f2_filter_tiles,
             "filter_gradient": _f2_filter_gradient, "output": _f2_output_tiles_body,
             "scatter": _f2_scatter_input_grad},
    (4, 3): {"input": _six_point_input_tiles(4), "gradient": _f4_gradient_tiles, "filter": _f4_filter_tiles,
             "filter_gradient": _f4_filter_gradient, "output": _six_point_output_tiles(4),
             "scatter": _six_point_scatter_input_grad(4)},
    (2, 5): {"input": _six_point_input_tiles(2), "gradient": _two_output_gradient_tiles(6),
             "filter": _f25_filter_tiles,
             "filter_gradient": _f25_filter_gradient, "output": _six_point_output_tiles(2),
             "scatter": _six_point_scatter_input_grad(2)},
}
