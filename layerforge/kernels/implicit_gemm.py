"""Convolution by GEMM, two ways: explicit im2col over the whole batch, and implicit GEMM over bounded tiles.

Both engines compute, for W (Cout, Cin/G, kh, kw) and x (N, Cin, H, W) with K = Cin/G kh kw per group,

    forward   y = W_g col_g                    (Cout/G x K) x (K x pixels)
    backward  gW_g += gy_g col_g^T,  gcol_g = W_g^T gy_g,  gx = col2im(gcol)

and differ in how much of ``col`` exists at once and how it is laid out:

* :class:`Im2colConv` (Caffe's algorithm, batched): one column buffer ``(K, out_h out_w N)`` for the
  whole minibatch, so every GEMM is one large BLAS call. The price: the buffer is K / Cin times the
  input, and x, y, gy and gx pass through one transposed copy each between NCHW and the
  batch-innermost layout (the bias add is fused into the copy of y); those copies, the lowering into the
  columns and the scatter back run on the kernel threads, split over channels (or images for y and gx).
* :class:`ImplicitGemmConv`: the full column matrix never exists. Tiles of whole images (or, when one
  image's columns exceed the budget, of output rows of one image) are lowered into a workspace bounded
  by ``budget`` bytes, laid out per image ``(n, K, P)``: the batched GEMM writes y straight into the
  NCHW top and reads gy straight from it, and a tile stays in cache between lowering and GEMM. A 1x1
  stride-1 unpadded convolution needs no lowering at all: x is its own column matrix.

Workspaces are scratch: nothing in them outlives one forward or backward call (backward lowers the
columns again, as Caffe does). So every layer's engines take their workspaces as views of the shared arenas of
kernels.workspace. ``workspace_bytes`` reports what an engine asks for; ``workspace.arena_bytes()`` what the arenas
hold; ``release()`` forgets an engine's requests (AUTO releases the engine it did not choose).

:class:`NdIm2colConv` is the explicit-column engine for 1, 3 or more spatial axes (and for 2 under
Caffe's ``force_nd_im2col``), with the same interface.
"""
import math

import numpy

from ..backend import get_array_module
from .blas import add_matmul_nt, matmul, row_sums
from .im2col import col2im_nd, col2im_tile, im2col_nd, im2col_tile
from .output_size import conv_output_size
from .threadpool import elementwise, host_work, parallel_for
from .workspace import arena

DEFAULT_BUDGET = 4 << 20  # bytes of column tile for IMPLICIT: a few MiB stays in L2/L3

class _GemmConv:
    name = None
    batch_invariant = False  # True: an image's result does not depend on the batch (blas.batch_invariant)

    def __init__(self, geometry, group):
        self.geometry, self.group = tuple(geometry), group
        self._requests = {}

    def _buffer(self, xp, key, shape, dtype):
        dtype = numpy.dtype(dtype)
        self._requests[key] = math.prod(shape) * dtype.itemsize
        return arena(xp, key, tuple(shape), dtype)

    @property
    def workspace_bytes(self):
        """Bytes of workspace this engine's last calls asked for (column tiles, transposed y / gy, padded x)."""
        return sum(self._requests.values())

    def release(self):
        self._requests = {}

    def _sizes(self, x, W):
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        n, c, h, w = x.shape
        out_h, out_w = conv_output_size(h, kh, sy, ph, dy), conv_output_size(w, kw, sx, pw, dx)
        g = self.group
        return n, c, h, w, out_h, out_w, g, W.shape[0] // g, W[0].size


def _bias_grad(gy, gb):
    # a GEMV against ones runs in BLAS; a sum over axes (0, 2, 3) is a slow strided reduction
    n, cout = gy.shape[:2]
    gb += row_sums(gy.reshape(n * cout, gy[0, 0].size)).reshape(n, cout).sum(axis=0)


class Im2colConv(_GemmConv):
    """Explicit im2col + one GEMM per group for the whole minibatch (workspace K x out_h out_w N).

    The batch is the innermost axis: x is copied once into a zero-bordered (C, Hp, Wp, N) buffer, and
    each kernel position's columns ``(C, out_h, out_w, N)`` are then copies whose contiguous runs are
    out_w N (unit stride) or N elements long, where the NCHW layout gives runs of out_w: for small
    images (LeNet's 8 x 8) that is the difference between memory speed and per-row overhead. The
    GEMM output (Cout, out_h, out_w, N) goes back to NCHW in one transposed copy with the bias fused in.
    """

    name = "IM2COL"

    def _taps(self, pad, out_h, out_w):
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        for i in range(kh):
            for j in range(kw):
                yield i, j, pad[:, i * dy:i * dy + sy * (out_h - 1) + 1:sy, j * dx:j * dx + sx * (out_w - 1) + 1:sx]

    def _columns(self, x, W):
        xp = get_array_module(x)
        n, c, h, w, out_h, out_w, g, cog, kg = self._sizes(x, W)
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        xpad = self._buffer(xp, "xpad", (c, h + 2 * ph, w + 2 * pw, n), x.dtype)
        col = self._buffer(xp, "col", (c, kh, kw, out_h, out_w, n), x.dtype)
        xt = x.transpose(1, 2, 3, 0)

        def lower(lo, hi):  # channels [lo, hi): x into the padded copy, then every tap into the columns
            if ph:
                xpad[lo:hi, :ph] = 0
                xpad[lo:hi, ph + h:] = 0
            if pw:
                xpad[lo:hi, :, :pw] = 0
                xpad[lo:hi, :, pw + w:] = 0
            xpad[lo:hi, ph:ph + h, pw:pw + w] = xt[lo:hi]
            for i, j, tap in self._taps(xpad, out_h, out_w):
                col[lo:hi, i, j] = tap[lo:hi]
        parallel_for(c, lower, work=host_work(xpad))
        return col.reshape(g, kg, out_h * out_w * n)

    def forward(self, x, W, b, y):
        """Write ``W * x (+ b)`` into ``y`` (N, Cout, out_h, out_w)."""
        xp = get_array_module(x)
        n, c, h, w, out_h, out_w, g, cog, kg = self._sizes(x, W)
        col = self._columns(x, W)
        yb = self._buffer(xp, "y", (g, cog, out_h * out_w * n), x.dtype)
        matmul(W.reshape(g, cog, kg), col, out=yb)
        src = yb.reshape(g * cog, out_h, out_w, n).transpose(3, 0, 1, 2)
        if b is None:
            elementwise(xp.copyto, y, src)
        else:
            bias = b[None, :, None, None]
            elementwise(lambda y, src: xp.add(src, bias, out=y), y, src)

    def backward(self, x, W, gy, gW, gb, gx):
        """Add the filter (and bias) gradients into ``gW`` (``gb``); write the data gradient into ``gx``.

        Any of ``gW``, ``gb``, ``gx`` may be None (not wanted); with ``gW`` None, x is used for its shape only.
        """
        xp = get_array_module(x)
        n, c, h, w, out_h, out_w, g, cog, kg = self._sizes(x, W)
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        gyt = self._buffer(xp, "y", (g, cog, out_h * out_w * n), x.dtype)
        elementwise(xp.copyto, gyt.reshape(g * cog, out_h, out_w, n), gy.transpose(1, 2, 3, 0))
        if gb is not None:
            gb += row_sums(gyt.reshape(g * cog, -1))
        if gW is not None:
            col = self._columns(x, W)
            add_matmul_nt(gW.reshape(g, cog, kg), gyt, col)
        else:  # the data gradient alone (a transposed convolution's forward): x's values are not read
            col = self._buffer(xp, "col", (c, kh, kw, out_h, out_w, n), x.dtype).reshape(g, kg, -1)
        if gx is None:
            return
        matmul(W.reshape(g, cog, kg).transpose(0, 2, 1), gyt, out=col)  # the columns are spent: reuse
        col6 = col.reshape(c, kh, kw, out_h, out_w, n)
        gpad = self._buffer(xp, "gxpad", (c, h + 2 * ph, w + 2 * pw, n), x.dtype)

        def scatter(lo, hi):  # channels [lo, hi): every tap's columns added back in the same order
            gpad[lo:hi] = 0
            for i, j, tap in self._taps(gpad, out_h, out_w):
                tap[lo:hi] += col6[lo:hi, i, j]
        parallel_for(c, scatter, work=host_work(gpad))
        elementwise(xp.copyto, gx, gpad[:, ph:ph + h, pw:pw + w].transpose(3, 0, 1, 2))


class ImplicitGemmConv(_GemmConv):
    """Implicit GEMM: per-tile lowering into a workspace of at most ``budget`` bytes, batched per image."""

    name = "IMPLICIT"
    # one GEMM of the same shape per image (its tiles never mix images' columns): invariant on the CPU
    batch_invariant = True

    def __init__(self, geometry, group, budget=None):
        super().__init__(geometry, group)
        self.budget = DEFAULT_BUDGET if budget is None else budget
        kh, kw, sy, sx, ph, pw = self.geometry[:6]
        self.pointwise = (kh, kw, sy, sx, ph, pw) == (1, 1, 1, 1, 0, 0)

    def tiles(self, x_shape, itemsize=4):
        """``[(n0, n1, r0, r1)]``: image range and output-row range of each tile of ``x_shape`` (N, C, H, W)."""
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        n, c, h, w = x_shape
        out_h, out_w = conv_output_size(h, kh, sy, ph, dy), conv_output_size(w, kw, sx, pw, dx)
        if self.pointwise:  # x is its own column matrix: one tile, no workspace
            return [(0, n, 0, out_h)]
        k = c * kh * kw
        per_row = k * out_w * itemsize
        if per_row * out_h <= self.budget:
            nb = max(1, self.budget // (per_row * out_h))
            return [(n0, min(n, n0 + nb), 0, out_h) for n0 in range(0, n, nb)]
        count = -(-out_h // max(1, self.budget // per_row))  # tiles of an image, its rows dealt evenly among them
        cuts = [out_h * k // count for k in range(count + 1)]
        return [(i, i + 1, cuts[k], cuts[k + 1]) for i in range(n) for k in range(count)]

    def _lower(self, x, W, n0, n1, r0, r1):
        xp = get_array_module(x)
        n, c, h, w, out_h, out_w, g, cog, kg = self._sizes(x, W)
        kh, kw = self.geometry[:2]
        if self.pointwise:
            return x[n0:n1]
        col = self._buffer(xp, "col", (n1 - n0, c, kh, kw, r1 - r0, out_w), x.dtype)
        im2col_tile(x[n0:n1].transpose(1, 0, 2, 3), col.transpose(1, 2, 3, 0, 4, 5), *self.geometry, r0=r0)
        return col

    def forward(self, x, W, b, y):
        xp = get_array_module(x)
        if xp is not numpy:  # the tiled kernels of kernels/cuda/implicit_gemm.cu: no workspace at all
            from .cuda.implicit_gemm import conv_forward_gpu
            return conv_forward_gpu(x, W, b, y, self.geometry, self.group)
        n, c, h, w, out_h, out_w, g, cog, kg = self._sizes(x, W)
        Wg = W.reshape(g, cog, kg)
        for n0, n1, r0, r1 in self.tiles(x.shape, x.itemsize):
            nb, pt = n1 - n0, (r1 - r0) * out_w
            col = self._lower(x, W, n0, n1, r0, r1).reshape(nb, g, kg, pt)
            if r1 - r0 == out_h:
                matmul(Wg, col, out=y[n0:n1].reshape(nb, g, cog, pt))
            else:
                yt = self._buffer(xp, "y", (nb, g, cog, pt), x.dtype)
                matmul(Wg, col, out=yt)
                y[n0:n1, :, r0:r1] = yt.reshape(nb, g * cog, r1 - r0, out_w)
        if b is not None:
            y += b[:, None, None]

    def backward(self, x, W, gy, gW, gb, gx):
        xp = get_array_module(x)
        if xp is not numpy:
            from .cuda.implicit_gemm import conv_backward_gpu
            return conv_backward_gpu(x, W, gy, gW, gb, gx, self.geometry, self.group)
        n, c, h, w, out_h, out_w, g, cog, kg = self._sizes(x, W)
        kh, kw = self.geometry[:2]
        if gb is not None:
            _bias_grad(gy, gb)
        if gx is not None and not self.pointwise:
            gx[...] = 0
        Wg = W.reshape(g, cog, kg)
        gW4 = None if gW is None else gW.reshape(g, cog, kg)
        for n0, n1, r0, r1 in self.tiles(x.shape, x.itemsize):
            nb, pt = n1 - n0, (r1 - r0) * out_w
            if gW is not None or self.pointwise:
                col = self._lower(x, W, n0, n1, r0, r1).reshape(nb, g, kg, pt)
            else:  # the data gradient alone: a workspace for its columns, x not lowered
                col = self._buffer(xp, "col", (nb, c, kh, kw, r1 - r0, out_w), x.dtype).reshape(nb, g, kg, pt)
            if r1 - r0 == out_h:
                gyt = gy[n0:n1].reshape(nb, g, cog, pt)
            else:
                gyt = self._buffer(xp, "y", (nb, g, cog, pt), x.dtype)
                gyt.reshape(nb, g * cog, r1 - r0, out_w)[...] = gy[n0:n1, :, r0:r1]
            if gW is not None:  # one image at a time: no partial products to hold and sum
                for k in range(nb):
                    add_matmul_nt(gW4, gyt[k], col[k])
            if gx is not None and self.pointwise:
                matmul(Wg.transpose(0, 2, 1), gyt, out=gx[n0:n1].reshape(nb, g, kg, pt))
            elif gx is not None:
                matmul(Wg.transpose(0, 2, 1), gyt, out=col)
                col6 = col.reshape(nb, c, kh, kw, r1 - r0, out_w).transpose(1, 2, 3, 0, 4, 5)
                col2im_tile(col6, gx[n0:n1].transpose(1, 0, 2, 3), *self.geometry, r0=r0)


class NdIm2colConv:
    """The IM2COL algorithm for any number of spatial axes (Caffe's N-d path): :func:`im2col_nd` columns of
    the whole batch and one batched GEMM over the groups. ``geometry`` is (kernel, stride, pad, dilation),
    each a tuple with one value per spatial axis; x (N, C, *spatial), W (Cout, C / G, *kernel)."""

    name = "IM2COL_ND"
    workspace_bytes = 0

    def __init__(self, geometry, group):
        self.geometry, self.group = geometry, group

    def release(self):
        pass

    def _gemm_shapes(self, x, W):
        g = self.group
        return g, W.shape[0] // g, W[0].size

    def forward(self, x, W, b, y):
        """y (N, Cout, *out) = W * x (+ b) for x (N, C, *spatial), W (Cout, C / G, *kernel)."""
        g, cog, kg = self._gemm_shapes(x, W)
        col = im2col_nd(x, *self.geometry)
        rest = col.shape[1 + len(self.geometry[0]):]  # (N, *out)
        out = matmul(W.reshape(g, cog, kg), col.reshape(g, kg, math.prod(rest)))
        y[...] = out.reshape((g * cog,) + rest).swapaxes(0, 1)
        if b is not None:
            y += b.reshape((1, -1) + (1,) * (y.ndim - 2))

    def backward(self, x, W, gy, gW, gb, gx):
        """Add into ``gW`` (``gb``), write ``gx``; any may be None (with ``gW`` None, x gives its shape only)."""
        g, cog, kg = self._gemm_shapes(x, W)
        rest = (gy.shape[0],) + gy.shape[2:]
        gyt = gy.swapaxes(0, 1).reshape(g, cog, math.prod(rest))
        if gb is not None:
            gb += gyt.reshape(g * cog, -1).sum(axis=1)
        if gW is not None:
            col = im2col_nd(x, *self.geometry).reshape(g, kg, -1)
            add_matmul_nt(gW.reshape(g, cog, kg), gyt, col)
        if gx is not None:
            kernel, stride, pad, dilation = self.geometry
            cols = matmul(W.reshape(g, cog, kg).transpose(0, 2, 1), gyt)
            c = x.shape[1]
            gx[...] = col2im_nd(cols.reshape((c,) + tuple(kernel) + rest), stride, pad, dilation, x.shape[2:])


from .winograd import WinogradF2Conv, WinogradF4Conv  # noqa: E402 - winograd imports im2col, not this module

ENGINES = {"IM2COL": Im2colConv, "IMPLICIT": ImplicitGemmConv, "WINOGRAD": WinogradF4Conv,
           "WINOGRAD_F2": WinogradF2Conv}


def gemm_shape(x_shape, w_shape, geometry, group):
    """``(M, N, K)`` of the forward GEMM per group for the whole batch (for rates and SGEMM comparisons)."""
    kh, kw, sy, sx, ph, pw, dy, dx = geometry
    n, c, h, w = x_shape
    out_h, out_w = conv_output_size(h, kh, sy, ph, dy), conv_output_size(w, kw, sx, pw, dx)
    return w_shape[0] // group, n * out_h * out_w, math.prod(w_shape[1:])
