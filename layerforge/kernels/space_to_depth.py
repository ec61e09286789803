"""Space-to-depth: a strided convolution as a stride-1 one over blocks of pixels, so that Winograd can run it.

A kh x kw convolution with stride (sy, sx) reads, for output (i, j), the rows ``i sy .. i sy + kh - 1`` of the
zero-padded input. Cut that input into sy x sx blocks: block row ``i`` holds rows ``i sy .. i sy + sy - 1``, so the
output reads the blocks ``i .. i + r - 1`` with ``r = ceil(kh / sy)``. Dealing each block's sy sx pixels out as
channels turns the layer into a stride-1 r x r convolution over ``C sy sx`` channels with no padding (the filter's
taps past kh, kw zero)::

    xs[n, (c, a, b), i, j] = xpad[n, c, i sy + a, j sx + b]      Ws[k, (c, a, b), p, q] = W[k, c, p sy + a, q sx + b]

AlexNet's conv1 (11 x 11, stride 4, 3 channels) becomes a 3 x 3 convolution over 48 channels of 57 x 57 blocks, which
Winograd F(4x4, 3x3) runs with 3.4x fewer multiplications than the direct one (4x, less the zero taps of its 12 x 12
filter), and whose input is read once to make the blocks where the strided lowering writes 121 taps of every pixel.
The channel order (c, a, b) keeps each group's channels together. Everything here is ``xp`` array code (numpy or
cupy), except the host's blocks, which one compiled pass over the image writes (a strided copy per phase, as numpy
would make it, ran at half the memory's speed); the blocks live in the "depth" workspace arena (kernels.workspace).
"""
import numpy

from ..backend import get_array_module
from .output_size import conv_output_size
from .threadpool import cpu_kernel, parallel_for
from .workspace import arena


def block_kernel(geometry):
    """The filter size in blocks, ``(ceil(kh / sy), ceil(kw / sx))``, of ``(kh, kw, sy, sx, ph, pw, dy, dx)``."""
    kh, kw, sy, sx = geometry[:4]
    return -(-kh // sy), -(-kw // sx)


class SpaceToDepth:
    """The space-to-depth form of one undilated convolution ``geometry`` (kh, kw, sy, sx, ph, pw, 1, 1).

    :attr:`geometry` is the stride-1, unpadded ``(rh, rw, 1, 1, 0, 0, 1, 1)`` convolution it becomes; :meth:`images`
    and :meth:`filters` make its operands and :meth:`add_filter_gradient` and :meth:`image_gradient` take its
    gradients back to the layer's shapes.
    """

    def __init__(self, geometry):
        kh, kw, sy, sx, ph, pw, dy, dx = geometry
        if (dy, dx) != (1, 1):
            raise ValueError(f"space-to-depth needs an undilated convolution, got geometry {geometry}")
        self.kernel, self.stride, self.pad = (kh, kw), (sy, sx), (ph, pw)
        rh, rw = block_kernel(geometry)
        self.geometry = (rh, rw, 1, 1, 0, 0, 1, 1)

    def blocks(self, x_shape):
        """The blocks' shape (N, C sy sx, Hb, Wb) for an input (N, C, H, W): as many block rows and columns as the
        stride-1 convolution needs for the layer's output size (trailing pixels no output reads are left out)."""
        n, c, h, w = x_shape
        (kh, kw), (sy, sx), (ph, pw) = self.kernel, self.stride, self.pad
        rh, rw = self.geometry[:2]
        out_h, out_w = conv_output_size(h, kh, sy, ph), conv_output_size(w, kw, sx, pw)
        return n, c * sy * sx, out_h + rh - 1, out_w + rw - 1

    def _phases(self, x_shape, hb, wb):
        """``(a, b, (i0, i1), (j0, j1), rows, cols)`` for every phase: the block rows i0..i1 and columns j0..j1
        whose pixel (a, b) lies in the image, and the image's rows and columns they hold (slices)."""
        h, w = x_shape[2:]
        (sy, sx), (ph, pw) = self.stride, self.pad

        def span(phase, step, pad, size, blocks):  # blocks k with 0 <= k step + phase - pad < size
            lo = max(0, -(-(pad - phase) // step))
            hi = min(blocks, -(-(size + pad - phase) // step))
            hi = max(hi, lo)
            start = lo * step + phase - pad
            return (lo, hi), slice(start, start + (hi - lo - 1) * step + 1 if hi > lo else start, step)

        for a in range(sy):
            (i0, i1), rows = span(a, sy, ph, h, hb)
            for b in range(sx):
                (j0, j1), cols = span(b, sx, pw, w, wb)
                yield a, b, (i0, i1), (j0, j1), rows, cols

    def images(self, x):
        """The blocks of x (N, C, H, W) with the layer's zero padding: (N, C sy sx, Hb, Wb), in the "depth" arena
        (valid until the next call)."""
        xp = get_array_module(x)
        n, c = x.shape[:2]
        (sy, sx) = self.stride
        _, _, hb, wb = self.blocks(x.shape)
        xs = arena(xp, "depth", (n, c, sy, sx, hb, wb), x.dtype)
        if xp is numpy:
            planes = numpy.ascontiguousarray(x).reshape((n * c,) + x.shape[2:])
            blocks = xs.reshape(n * c, sy, sx, hb, wb)
            parallel_for(n * c, lambda lo, hi: _host_blocks(planes, sy, sx, *self.pad, lo, hi, blocks), work=xs.size)
            return xs.reshape(n, c * sy * sx, hb, wb)
        for a, b, (i0, i1), (j0, j1), rows, cols in self._phases(x.shape, hb, wb):
            part = xs[:, :, a, b]
            part[:, :, :i0], part[:, :, i1:], part[:, :, i0:i1, :j0], part[:, :, i0:i1, j1:] = 0, 0, 0, 0
            part[:, :, i0:i1, j0:j1] = x[:, :, rows, cols]
        return xs.reshape(n, c * sy * sx, hb, wb)

    def image_gradient(self, gxs, gx):
        """Write into gx (N, C, H, W) the gradient of the blocks ``gxs`` (N, C sy sx, Hb, Wb): every pixel is in
        one block, so each takes its one value (zero for the trailing pixels no output reads)."""
        n, c = gx.shape[:2]
        (sy, sx), (ph, pw), (hb, wb) = self.stride, self.pad, gxs.shape[2:]
        gxs = gxs.reshape(n, c, sy, sx, hb, wb)
        for a, b, (i0, i1), (j0, j1), rows, cols in self._phases(gx.shape, hb, wb):
            gx[:, :, rows, cols] = gxs[:, :, a, b, i0:i1, j0:j1]
        gx[:, :, max(0, hb * sy - ph):] = 0  # the trailing rows and columns past the last block (empty if none)
        gx[:, :, :, max(0, wb * sx - pw):] = 0

    def filters(self, W):
        """The filters (K, C/G, kh, kw) as (K, C/G sy sx, rh, rw), zero past kh and kw."""
        xp = get_array_module(W)
        k, cg, kh, kw = W.shape
        (sy, sx), (rh, rw) = self.stride, self.geometry[:2]
        padded = xp.zeros((k, cg, rh * sy, rw * sx), dtype=W.dtype)
        padded[:, :, :kh, :kw] = W
        return xp.ascontiguousarray(padded.reshape(k, cg, rh, sy, rw, sx).transpose(0, 1, 3, 5, 2, 4)).reshape(
            k, cg * sy * sx, rh, rw)

    def add_filter_gradient(self, gWs, gW):
        """``gW += `` the gradient ``gWs`` (K, C/G sy sx, rh, rw) of :meth:`filters`, as (K, C/G, kh, kw)."""
        k, cg, kh, kw = gW.shape
        (sy, sx), (rh, rw) = self.stride, self.geometry[:2]
        full = gWs.reshape(k, cg, sy, sx, rh, rw).transpose(0, 1, 4, 2, 5, 3).reshape(k, cg, rh * sy, rw * sx)
        gW += full[:, :, :kh, :kw]


@cpu_kernel
def _host_blocks(x, sy, sx, ph, pw, lo, hi, xs):
    # planes [lo, hi) of x (P, H, W) into their blocks xs (P, sy, sx, Hb, Wb): every block pixel written once, the
    # image's value or zero, in the blocks' order so that the writes stream
    _, h, w = x.shape
    _, _, _, hb, wb = xs.shape
    for p in range(lo, hi):
        for a in range(sy):
            for i in range(hb):
                row = i * sy + a - ph
                for b in range(sx):
                    out = xs[p, a, b, i]
                    if row < 0 or row >= h:
                        out[:] = 0
                        continue
                    src = x[p, row]
                    for j in range(wb):
                        col = j * sx + b - pw
                        out[j] = src[col] if 0 <= col < w else 0
