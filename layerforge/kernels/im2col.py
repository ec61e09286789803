"""im2col / col2im for NCHW batches, and Caffe's output-size formulas.

The column buffer is laid out ``(C, kh, kw, N, out_h, out_w)``: channel-major, batch inside, so that
``col.reshape(C * kh * kw, N * out_h * out_w)`` is one GEMM operand for the whole minibatch (and a
reshape to ``(group, C / group * kh * kw, N * out_h * out_w)`` one batched GEMM for grouped
convolution). The bodies loop over the kh * kw kernel positions only; each step copies one strided
slice of the image for every image and channel at once.

:func:`im2col_tile` / :func:`col2im_tile` are the workhorses of the convolution engines: they write
into (or add from) a caller's reused buffer, any strided view of the six axes, for a tile of images and
output rows. Padding is never materialised: each kernel position copies only the output positions whose
input lies inside the image and zeroes the rest. On the views of the IMPLICIT engine's layouts (numpy arrays)
they run as compiled loops, one channel's plane at a time, with the slicing bodies' values and bits.

As in ``chainer/utils/conv.py``: ``im2col_cpu`` / ``col2im_cpu`` are the xp slicing bodies and ``im2col``
/ ``col2im`` the entry points, which send cupy arrays to the CUDA kernels of kernels/cuda/im2col.cu.
"""

import functools
import itertools

import numpy

from ..backend import get_array_module
from .output_size import conv_output_size
from .threadpool import cpu_kernel, host_work, parallel_for


def _strided(start, stride, count):
    return slice(start, start + stride * (count - 1) + 1, stride)


def _valid(size, offset, s, lo, hi):
    """Output positions ``[a, b)`` within ``[lo, hi)`` whose input ``p s + offset`` lies in ``[0, size)``."""
    a = max(lo, (-offset + s - 1) // s if offset < 0 else 0)
    b = min(hi, (size - 1 - offset) // s + 1)
    return a, max(a, b)


def _taps(h, w, kh, kw, sy, sx, ph, pw, dy, dx, r0, rows, out_w):
    # per kernel position: (i, j, output rows [a, b) relative to r0, output cols [a2, b2), input row/col slices)
    for i in range(kh):
        oy = i * dy - ph
        a, b = _valid(h, oy, sy, r0, r0 + rows)
        for j in range(kw):
            ox = j * dx - pw
            a2, b2 = _valid(w, ox, sx, 0, out_w)
            yield (i, j, a - r0, b - r0, a2, b2,
                   _strided(a * sy + oy, sy, b - a) if b > a else None,
                   _strided(a2 * sx + ox, sx, b2 - a2) if b2 > a2 else None)


def im2col_tile(xt, col, kh, kw, sy, sx, ph, pw, dy=1, dx=1, r0=0):
    """Write columns of ``xt`` (C, n, H, W) into ``col`` (C, kh, kw, n, rows, out_w) for output rows ``r0 ..``.

    ``col`` may be any strided view (the engines pass transposed views of their own layouts); every
    element is written, so a reused buffer needs no clearing. numpy arrays are split over channels on
    the kernel threads (kernels.threadpool).
    """
    if _compiled_call(_im2col_compiled, xt, col, kh, kw, sy, sx, ph, pw, dy, dx, r0):
        return
    parallel_for(xt.shape[0], lambda lo, hi: _im2col_slice(xt[lo:hi], col[lo:hi], kh, kw, sy, sx, ph, pw, dy, dx,
                                                           r0), work=host_work(col, kh * kw))


def _im2col_slice(xt, col, kh, kw, sy, sx, ph, pw, dy, dx, r0):
    c, n, h, w = xt.shape
    rows, out_w = col.shape[4:]
    for i, j, a, b, a2, b2, ys, xs in _taps(h, w, kh, kw, sy, sx, ph, pw, dy, dx, r0, rows, out_w):
        dst = col[:, i, j]
        if ys is None or xs is None:
            dst[...] = 0
            continue
        if a > 0:
            dst[:, :, :a] = 0
        if b < rows:
            dst[:, :, b:] = 0
        if a2 > 0:
            dst[:, :, a:b, :a2] = 0
        if b2 < out_w:
            dst[:, :, a:b, b2:] = 0
        dst[:, :, a:b, a2:b2] = xt[:, :, ys, xs]


def col2im_tile(col, gxt, kh, kw, sy, sx, ph, pw, dy=1, dx=1, r0=0):
    """Add ``col`` (C, kh, kw, n, rows, out_w) into ``gxt`` (C, n, H, W): the adjoint of :func:`im2col_tile`
    (split over channels like it)."""
    if _compiled_call(_col2im_compiled, gxt, col, kh, kw, sy, sx, ph, pw, dy, dx, r0):
        return
    parallel_for(gxt.shape[0], lambda lo, hi: _col2im_slice(col[lo:hi], gxt[lo:hi], kh, kw, sy, sx, ph, pw, dy,
                                                            dx, r0), work=host_work(col, kh * kw))


def _col2im_slice(col, gxt, kh, kw, sy, sx, ph, pw, dy, dx, r0):
    c, n, h, w = gxt.shape
    rows, out_w = col.shape[4:]
    for i, j, a, b, a2, b2, ys, xs in _taps(h, w, kh, kw, sy, sx, ph, pw, dy, dx, r0, rows, out_w):
        if ys is not None and xs is not None:
            gxt[:, :, ys, xs] += col[:, i, j, :, a:b, a2:b2]


# The numpy bodies of the two above as compiled loops: one channel's image plane at a time, every tap of it while
# the plane is in the cache, where the slicing bodies make a pass over all channels per tap (a strided copy of out_w
# elements per numpy inner loop: ResNet-50's stride-2 3 x 3 layers spent a third of their time lowering). The same
# values, and col2im adds each element's taps in the same order (i, then j), so the same bits.

def _compiled_call(kernel, xt, col, kh, kw, sy, sx, ph, pw, dy, dx, r0):
    """Run ``kernel`` over xt's channels on the kernel threads, on the C-contiguous (n, C, H, W) and
    (n, C, kh, kw, rows, out_w) arrays behind the views the IMPLICIT engine passes; False (nothing run) for other
    arrays. The kernel gets each kernel row's output rows and each kernel column's output columns that lie inside
    the image (:func:`_valid`)."""
    if type(xt) is not numpy.ndarray or type(col) is not numpy.ndarray:
        return False
    x, columns = xt.transpose(1, 0, 2, 3), col.transpose(3, 0, 1, 2, 4, 5)
    if not (x.flags.c_contiguous and columns.flags.c_contiguous):
        return False
    inside_rows, inside_cols = _inside(x.shape[2:], col.shape[4:], kh, kw, sy, sx, ph, pw, dy, dx, r0)
    parallel_for(xt.shape[0], lambda lo, hi: kernel(x, columns, inside_rows, inside_cols, sy, sx, ph, pw, dy, dx, r0,
                                                    lo, hi), work=host_work(col, kh * kw))
    return True


@functools.lru_cache(maxsize=256)
def _inside(size, tile, kh, kw, sy, sx, ph, pw, dy, dx, r0):
    # per kernel row the tile's output rows [top, bottom), per kernel column the output columns [a, b), whose input
    # lies inside the image (size (H, W); tile (rows, out_w)): a layer's tiles ask for the same few, call after call
    (h, w), (rows, out_w) = size, tile
    inside_rows = numpy.array([_valid(h, i * dy - ph, sy, r0, r0 + rows) for i in range(kh)], numpy.int64) - r0
    inside_cols = numpy.array([_valid(w, j * dx - pw, sx, 0, out_w) for j in range(kw)], numpy.int64)
    return inside_rows, inside_cols


@cpu_kernel(reassociate=False)
def _im2col_compiled(x, col, inside_rows, inside_cols, sy, sx, ph, pw, dy, dx, r0, lo, hi):
    # x (n, C, H, W) into col (n, C, kh, kw, rows, out_w), channels [lo, hi)
    for m in range(x.shape[0]):
        for c in range(lo, hi):
            for i in range(col.shape[2]):
                top, bottom = inside_rows[i, 0], inside_rows[i, 1]
                for j in range(col.shape[3]):
                    taps, a, b = col[m, c, i, j], inside_cols[j, 0], inside_cols[j, 1]
                    w = taps.shape[1]
                    if sx == 1 and sy == 1 and w == x.shape[3] and top < bottom:
                        # stride 1, the output as wide as the image: the tap's rows [top, bottom) of columns [a, b)
                        # are one run of the flat image, copied as one (a view per row costs more than copying a
                        # row of 27), then the columns outside [a, b) that the run wrapped into are zeroed
                        flat, first, last = taps.reshape(-1), top * w + a, (bottom - 1) * w + b
                        source = (r0 + top - ph + i * dy) * w + a + j * dx - pw
                        flat[:first] = 0
                        flat[last:] = 0
                        run, image = flat[first:last], x[m, c].reshape(-1)[source:source + last - first]
                        for o in range(run.size):
                            run[o] = image[o]
                        if a > 0 or b < w:
                            for r in range(top, bottom):
                                for o in range(a):
                                    taps[r, o] = 0
                                for o in range(b, w):
                                    taps[r, o] = 0
                        continue
                    taps[:top] = 0
                    taps[bottom:] = 0
                    for r in range(top, bottom):
                        src, dst = x[m, c, (r0 + r) * sy - ph + i * dy], taps[r]
                        dst[:a] = 0
                        dst[b:] = 0
                        inside, start = dst[a:b], a * sx + j * dx - pw
                        if sx == 1:
                            src = src[start:start + inside.size]
                            for o in range(inside.size):
                                inside[o] = src[o]
                        else:
                            for o in range(inside.size):
                                inside[o] = src[start + o * sx]


@cpu_kernel(reassociate=False)
def _col2im_compiled(gx, col, inside_rows, inside_cols, sy, sx, ph, pw, dy, dx, r0, lo, hi):
    # gx (n, C, H, W) += the taps of col (n, C, kh, kw, rows, out_w) in the order (i, j), channels [lo, hi)
    for m in range(gx.shape[0]):
        for c in range(lo, hi):
            for i in range(col.shape[2]):
                for j in range(col.shape[3]):
                    a, b = inside_cols[j, 0], inside_cols[j, 1]
                    start = a * sx + j * dx - pw
                    for r in range(inside_rows[i, 0], inside_rows[i, 1]):
                        src, row = col[m, c, i, j, r, a:b], gx[m, c, (r0 + r) * sy - ph + i * dy]
                        if sx == 1:
                            dst = row[start:start + src.size]
                            for o in range(src.size):
                                dst[o] += src[o]
                        else:
                            for o in range(src.size):
                                row[start + o * sx] += src[o]


def im2col_cpu(x, kh, kw, sy, sx, ph, pw, dy=1, dx=1):
    """Columns of ``x`` (N, C, H, W) for a kh x kw kernel: an array (C, kh, kw, N, out_h, out_w).

    ``col[c, i, j, n, y, x] = x[n, c, y sy - ph + i dy, x sx - pw + j dx]`` (0 outside the image).
    """
    xp = get_array_module(x)
    n, c, h, w = x.shape
    out_h = conv_output_size(h, kh, sy, ph, dy)
    out_w = conv_output_size(w, kw, sx, pw, dx)
    col = xp.empty((c, kh, kw, n, out_h, out_w), dtype=x.dtype)
    im2col_tile(x.transpose(1, 0, 2, 3), col, kh, kw, sy, sx, ph, pw, dy, dx)
    return col


def col2im_cpu(col, sy, sx, ph, pw, h, w, dy=1, dx=1):
    """The adjoint of :func:`im2col_cpu`: sum columns (C, kh, kw, N, out_h, out_w) back into (N, C, h, w)."""
    xp = get_array_module(col)
    c, kh, kw, n, out_h, out_w = col.shape
    gx = xp.zeros((n, c, h, w), dtype=col.dtype)
    col2im_tile(col, gx.transpose(1, 0, 2, 3), kh, kw, sy, sx, ph, pw, dy, dx)
    return gx


def im2col(x, kh, kw, sy, sx, ph, pw, dy=1, dx=1):
    """Columns ``(C, kh, kw, N, out_h, out_w)`` of an NCHW batch (cupy arrays: kernels/cuda/im2col.cu)."""
    if get_array_module(x) is not numpy:
        from .cuda.im2col import im2col_gpu
        return im2col_gpu(x, kh, kw, sy, sx, ph, pw, dy, dx)
    return im2col_cpu(x, kh, kw, sy, sx, ph, pw, dy, dx)


def col2im(col, sy, sx, ph, pw, h, w, dy=1, dx=1):
    """The adjoint of :func:`im2col`: sums columns back into an ``(N, C, h, w)`` image."""
    if get_array_module(col) is not numpy:
        from .cuda.im2col import col2im_gpu
        return col2im_gpu(col, sy, sx, ph, pw, h, w, dy, dx)
    return col2im_cpu(col, sy, sx, ph, pw, h, w, dy, dx)


# ---- N-d: any number of spatial axes (Caffe's im2col_nd / col2im_nd, used by the force_nd_im2col path) ----
#
# For D spatial axes (kernel k, stride s, pad p, dilation d, each a D-tuple) the columns of x (N, C, *S) are
# col (C, *k, N, *O) with ``col[c, *j, n, *o] = x[n, c, *(o s - p + j d)]`` (0 in the padding): the 2-D
# layout above with more axes. One xp body: a zero-padded copy of x, then one strided slice per kernel
# position (prod(k) copies of an (N, C, *O) view).

def conv_output_shape(spatial, kernel, stride, pad, dilation):
    """:func:`conv_output_size` for every spatial axis."""
    return tuple(conv_output_size(*a) for a in zip(spatial, kernel, stride, pad, dilation))


def _taps_nd(kernel, stride, dilation, out):
    """(kernel position, slices of the padded input) for every position of an N-d kernel."""
    for j in itertools.product(*(range(k) for k in kernel)):
        yield j, tuple(_strided(jj * d, st, o) for jj, d, st, o in zip(j, dilation, stride, out))


def _interior(spatial, pad):
    return (slice(None), slice(None)) + tuple(slice(p, p + s) for s, p in zip(spatial, pad))


def im2col_nd(x, kernel, stride, pad, dilation):
    """Columns ``(C, *kernel, N, *out)`` of ``x`` (N, C, *spatial)."""
    xp = get_array_module(x)
    n, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
    out = conv_output_shape(spatial, kernel, stride, pad, dilation)
    xpad = xp.zeros((c, n) + tuple(s + 2 * p for s, p in zip(spatial, pad)), dtype=x.dtype)
    xpad[_interior(spatial, pad)] = x.swapaxes(0, 1)
    col = xp.empty((c,) + tuple(kernel) + (n,) + out, dtype=x.dtype)
    for j, window in _taps_nd(kernel, stride, dilation, out):
        col[(slice(None),) + j] = xpad[(slice(None), slice(None)) + window]
    return col


def col2im_nd(col, stride, pad, dilation, spatial):
    """The adjoint of :func:`im2col_nd`: columns ``(C, *kernel, N, *out)`` summed back into (N, C, *spatial)."""
    xp = get_array_module(col)
    d = len(spatial)
    c, kernel, n, out = col.shape[0], col.shape[1:1 + d], col.shape[1 + d], col.shape[2 + d:]
    gpad = xp.zeros((c, n) + tuple(s + 2 * p for s, p in zip(spatial, pad)), dtype=col.dtype)
    for j, window in _taps_nd(kernel, stride, dilation, out):
        gpad[(slice(None), slice(None)) + window] += col[(slice(None),) + j]
    return gpad[_interior(spatial, pad)].swapaxes(0, 1)
