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
  NCHW top (a tile of rows too: its rows of a channel are one run) and reads gy straight from it. The
  tiles are dealt out to the kernel threads, each lowering and multiplying its own in its own workspace
  (each product on its thread's BLAS), so that a tile stays in its core's caches between lowering and
  GEMM and no thread waits for the other between tiles; the data gradient deals whole images (their
  tiles' gradients overlap), and the filter gradient, a sum over the batch, adds the images' in order
  (:meth:`ImplicitGemmConv._add_filter_gradient`), so the results are the same on any number of threads.
  A 1x1 stride-1 unpadded convolution needs no lowering at all: x is its own column matrix.

Every engine's backward can add the data gradient into ``gx`` instead of writing it (``add_gx``): the Net lets the
consumers of a Split's tops make the Split's sum that way (net/net.py), the product with beta = 1 or the scatter
adding into what the others wrote, where a separate sum would read two diffs and write a third.

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
from .blas import add_matmul, add_matmul_nt, matmul, one_blas_thread, row_sums
from .im2col import col2im_nd, col2im_tile, im2col_nd, im2col_tile
from .output_size import conv_output_size
from .threadpool import MIN_PARALLEL_ELEMENTS, elementwise, host_work, num_threads, parallel_for
from .workspace import arena

# bytes of column tile for IMPLICIT, each kernel thread's: a few MiB stays in L2/L3 (1 and 2 MiB, within the 2 MiB L2
# of a core of this project's AVX-512 machine, ran ResNet-50's strided layers 2-15% slower, docs/performance.md)
DEFAULT_BUDGET = 4 << 20

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

    def backward(self, x, W, gy, gW, gb, gx, add_gx=False):
        """Add the filter (and bias) gradients into ``gW`` (``gb``); write the data gradient into ``gx`` (``add_gx``:
        add it to what ``gx`` holds).

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
        src = gpad[:, ph:ph + h, pw:pw + w].transpose(3, 0, 1, 2)
        elementwise((lambda out, s: xp.add(out, s, out=out)) if add_gx else xp.copyto, gx, src)


class ImplicitGemmConv(_GemmConv):
    """Implicit GEMM: per-tile lowering into a workspace of at most ``budget`` bytes a kernel thread, batched per
    image."""

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
        if per_row * out_h <= self.budget:  # whole images, as evenly as the budget allows, a tile a thread at least
            count = max(-(-n // max(1, self.budget // (per_row * out_h))), min(n, num_threads()))
            cuts = [n * i // count for i in range(count + 1)]
            return [(cuts[i], cuts[i + 1], 0, out_h) for i in range(count)]
        count = -(-out_h // max(1, self.budget // per_row))  # tiles of an image, its rows dealt evenly among them
        cuts = [out_h * k // count for k in range(count + 1)]
        return [(i, i + 1, cuts[k], cuts[k + 1]) for i in range(n) for k in range(count)]

    def _lower(self, x, W, n0, n1, r0, r1, slot=0):
        """The columns of images n0..n1, output rows r0..r1: x itself (1x1), or lowered into workspace ``slot``."""
        xp = get_array_module(x)
        n, c, h, w, out_h, out_w, g, cog, kg = self._sizes(x, W)
        kh, kw = self.geometry[:2]
        if self.pointwise:
            return x[n0:n1]
        col = self._buffer(xp, _column_role(slot), (n1 - n0, c, kh, kw, r1 - r0, out_w), x.dtype)
        im2col_tile(x[n0:n1].transpose(1, 0, 2, 3), col.transpose(1, 2, 3, 0, 4, 5), *self.geometry, r0=r0)
        return col

    def _groups(self, tiles, whole_images):
        """The tiles cut into one contiguous run per kernel thread (fewer where there are fewer tiles); with
        ``whole_images`` no image's tiles are in two runs (their data gradients overlap at the cuts)."""
        threads = num_threads()
        if whole_images:
            first, last = tiles[0][0], tiles[-1][1]
            cuts = [first + (last - first) * k // threads for k in range(threads + 1)]
            runs = [[t for t in tiles if lo <= t[0] < hi] for lo, hi in zip(cuts, cuts[1:])]
        else:
            runs = [tiles[len(tiles) * k // threads:len(tiles) * (k + 1) // threads] for k in range(threads)]
        return [run for run in runs if run]

    def _over_tiles(self, tiles, body, whole_images=False):
        """``body(run, slot)`` for each run of tiles (:meth:`_groups`) on the kernel threads, each product on its
        thread's BLAS; ``slot`` names the run's own workspace. A tile is lowered and multiplied by one thread,
        with its columns in that core's caches, and no thread waits for another between tiles."""
        runs = self._groups(tiles, whole_images)
        if len(runs) == 1:  # one run (one tile, or one thread): its products shared as the BLAS shares them
            body(runs[0], 0)
            return
        with one_blas_thread():
            parallel_for(len(runs), lambda lo, hi: [body(runs[k], k) for k in range(lo, hi)],
                         work=MIN_PARALLEL_ELEMENTS)

    def forward(self, x, W, b, y):
        xp = get_array_module(x)
        if xp is not numpy:  # the tiled kernels of kernels/cuda/implicit_gemm.cu: no workspace at all
            from .cuda.implicit_gemm import conv_forward_gpu
            return conv_forward_gpu(x, W, b, y, self.geometry, self.group)
        n, c, h, w, out_h, out_w, g, cog, kg = self._sizes(x, W)
        Wg = W.reshape(g, cog, kg)

        def run(tiles, slot):
            for n0, n1, r0, r1 in tiles:
                nb, pt = n1 - n0, (r1 - r0) * out_w
                col = self._lower(x, W, n0, n1, r0, r1, slot).reshape(nb, g, kg, pt)
                matmul(Wg, col, out=_view(y[n0:n1, :, r0:r1], (nb, g, cog, pt)))
        self._over_tiles(self.tiles(x.shape, x.itemsize), run)
        if b is not None:
            y += b[:, None, None]

    def backward(self, x, W, gy, gW, gb, gx, add_gx=False):
        xp = get_array_module(x)
        if xp is not numpy:
            from .cuda.implicit_gemm import conv_backward_gpu
            # the CUDA kernels write gx; an added gradient goes through a scratch array
            out = xp.empty_like(gx) if add_gx and gx is not None else gx
            conv_backward_gpu(x, W, gy, gW, gb, out, self.geometry, self.group)
            if out is not gx:
                gx += out
            return
        n, c, h, w, out_h, out_w, g, cog, kg = self._sizes(x, W)
        kh, kw = self.geometry[:2]
        if gb is not None:
            _bias_grad(gy, gb)
        Wg = W.reshape(g, cog, kg)
        tiles = self.tiles(x.shape, x.itemsize)
        if gW is not None:
            self._add_filter_gradient(x, W, gy, gW, tiles)
        if gx is None:
            return
        if self.pointwise:
            pixels = out_h * out_w
            gxv, gy4 = _view(gx, (n, g, kg, pixels)), gy.reshape(n, g, cog, pixels)
            if add_gx:  # beta = 1: no zeroing pass over gx either
                add_matmul(gxv, Wg.transpose(0, 2, 1), gy4)
            else:
                matmul(Wg.transpose(0, 2, 1), gy4, out=gxv)
            return

        def run(tiles, slot):  # an image's tiles on one thread: their gradients overlap in gx
            if not add_gx:
                gx[tiles[0][0]:tiles[-1][1]] = 0
            for n0, n1, r0, r1 in tiles:
                nb, pt = n1 - n0, (r1 - r0) * out_w
                gcol = self._buffer(xp, _column_role(slot), (nb, c, kh, kw, r1 - r0, out_w), x.dtype)
                gyt = gy[n0:n1, :, r0:r1].reshape(nb, g, cog, pt)
                matmul(Wg.transpose(0, 2, 1), gyt, out=gcol.reshape(nb, g, kg, pt))
                col2im_tile(gcol.transpose(1, 2, 3, 0, 4, 5), gx[n0:n1].transpose(1, 0, 2, 3), *self.geometry, r0=r0)
        self._over_tiles(tiles, run, whole_images=True)

    def _add_filter_gradient(self, x, W, gy, gW, tiles):
        """gW += the filter gradient, image by image in the batch's order (the same sums on any number of threads).

        Where the images' gradients are small (:data:`PARTIAL_BYTES` for all of them: a few filters over large images,
        ResNet-50's conv1 and its 56 x 56 1x1 layers), each image's is made apart by the thread that lowers its tiles
        (a 1x1 layer's: an image a tile), and they are added in order; else tile by tile, the threads sharing each
        image's product."""
        n, c, h, w, out_h, out_w, g, cog, kg = self._sizes(x, W)
        gW4 = gW.reshape(g, cog, kg)

        def add(tiles, slot, into):
            for n0, n1, r0, r1 in tiles:
                nb, pt = n1 - n0, (r1 - r0) * out_w
                col = self._lower(x, W, n0, n1, r0, r1, slot).reshape(nb, g, kg, pt)
                gyt = gy[n0:n1, :, r0:r1].reshape(nb, g, cog, pt)  # a view where gy is contiguous
                for k in range(nb):  # one image at a time: no partial products to hold and sum
                    add_matmul_nt(into(n0 + k), gyt[k], col[k])
        if n == 1 or n * gW.nbytes > PARTIAL_BYTES:
            add(tiles, 0, lambda image: gW4)
            return
        parts = numpy.zeros((n,) + gW4.shape, gW.dtype)
        if self.pointwise:  # x is the columns of one tile of every image: an image a tile, dealt to the threads
            tiles = [(i, i + 1, 0, out_h) for i in range(n)]
        self._over_tiles(tiles, lambda run, slot: add(run, slot, parts.__getitem__), whole_images=True)
        for part in parts:
            gW4 += part


# the most bytes of the images' filter gradients that IMPLICIT makes apart (ImplicitGemmConv._add_filter_gradient): at
# batch 8 on 2 threads, ResNet-50's conv1 took 29 ms against 41 tile by tile, its 56 x 56 1x1 layers 2-25% less; at 4
# MiB its 28 x 28 1x1 layers (256-512 KiB each) gained or lost up to 10% (docs/performance.md)
PARTIAL_BYTES = 1 << 20


def _column_role(slot):
    # the workspace arena of a run's columns: the first run's is the one IM2COL's and Winograd's share
    return "col" if slot == 0 else f"col{slot}"


# numpy 2.1 gave reshape its copy argument; setting an array's shape, the way before it, is deprecated from 2.5 on
_RESHAPE_HAS_COPY = numpy.lib.NumpyVersion(numpy.__version__) >= "2.1.0"


def _view(a, shape):
    """``a`` reshaped to ``shape`` without a copy, for an output (an image tile's rows of every channel: rows apart by
    the plane); raises where a view cannot be."""
    if _RESHAPE_HAS_COPY:
        return numpy.reshape(a, shape, copy=False)
    v = a.view()
    v.shape = shape
    return v


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

    def backward(self, x, W, gy, gW, gb, gx, add_gx=False):
        """Add into ``gW`` (``gb``), write ``gx`` (``add_gx``: add into it); any may be None (with ``gW`` None, x gives
        its shape only)."""
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
            grad = col2im_nd(cols.reshape((c,) + tuple(kernel) + rest), stride, pad, dilation, x.shape[2:])
            if add_gx:
                gx += grad
            else:
                gx[...] = grad


from .winograd import WinogradF2Conv, WinogradF4Conv  # noqa: E402 - winograd imports im2col, not this module

ENGINES = {"IM2COL": Im2colConv, "IMPLICIT": ImplicitGemmConv, "WINOGRAD": WinogradF4Conv,
           "WINOGRAD_F2": WinogradF2Conv}


def gemm_shape(x_shape, w_shape, geometry, group):
    """``(M, N, K)`` of the forward GEMM per group for the whole batch (for rates and SGEMM comparisons)."""
    kh, kw, sy, sx, ph, pw, dy, dx = geometry
    n, c, h, w = x_shape
    out_h, out_w = conv_output_size(h, kh, sy, ph, dy), conv_output_size(w, kw, sx, pw, dx)
    return w_shape[0] // group, n * out_h * out_w, math.prod(w_shape[1:])
