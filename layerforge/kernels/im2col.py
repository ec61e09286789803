"""im2col / col2im for NCHW batches, and Caffe's output-size formulas.

The column buffer is laid out ``(C, kh, kw, N, out_h, out_w)``: channel-major, batch inside, so that
``col.reshape(C * kh * kw, N * out_h * out_w)`` is one GEMM operand for the whole minibatch (and a
reshape to ``(group, C / group * kh * kw, N * out_h * out_w)`` one batched GEMM for grouped
convolution). The bodies loop over the kh * kw kernel positions only; each step copies one strided
slice of the padded image for every image and channel at once.

As in ``chainer/utils/conv.py``: ``im2col_cpu`` / ``col2im_cpu`` are the xp slicing bodies, ``im2col``
/ ``col2im`` dispatch by array type. Raw CUDA kernels (``im2col_gpu`` / ``col2im_gpu``) come with the
performance work; until then the slicing bodies serve cupy arrays too.
"""
import numpy

from ..backend import get_array_module

im2col_gpu = None
col2im_gpu = None


def conv_output_size(size, k, s, p, d=1):
    """Caffe's convolution output length: ``floor((size + 2p - (d (k - 1) + 1)) / s) + 1``."""
    return (size + 2 * p - (d * (k - 1) + 1)) // s + 1


def pooling_output_size(size, k, s, p, ceil_mode=True):
    """Caffe's pooling output length: ``ceil((size + 2p - k) / s) + 1`` (floor when ``ceil_mode`` is False).

    With padding, a last window that would start in the right/bottom padding is dropped
    (``(out - 1) s >= size + p``), so every window starts inside the image or the left/top pad.
    """
    span = size + 2 * p - k
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if p > 0 and (out - 1) * s >= size + p:
        out -= 1
    return out


def _strided(start, stride, count):
    return slice(start, start + stride * (count - 1) + 1, stride)


def im2col_cpu(x, kh, kw, sy, sx, ph, pw, dy=1, dx=1):
    """Columns of ``x`` (N, C, H, W) for a kh x kw kernel: an array (C, kh, kw, N, out_h, out_w).

    ``col[c, i, j, n, y, x] = x[n, c, y sy - ph + i dy, x sx - pw + j dx]`` (0 outside the image).
    """
    xp = get_array_module(x)
    n, c, h, w = x.shape
    out_h = conv_output_size(h, kh, sy, ph, dy)
    out_w = conv_output_size(w, kw, sx, pw, dx)
    if ph or pw:
        img = xp.zeros((c, n, h + 2 * ph, w + 2 * pw), dtype=x.dtype)
        img[:, :, ph:ph + h, pw:pw + w] = x.transpose(1, 0, 2, 3)
    else:
        img = x.transpose(1, 0, 2, 3)
    col = xp.empty((c, kh, kw, n, out_h, out_w), dtype=x.dtype)
    for i in range(kh):
        rows = _strided(i * dy, sy, out_h)
        for j in range(kw):
            col[:, i, j] = img[:, :, rows, _strided(j * dx, sx, out_w)]
    return col


def col2im_cpu(col, sy, sx, ph, pw, h, w, dy=1, dx=1):
    """The adjoint of :func:`im2col_cpu`: sum columns (C, kh, kw, N, out_h, out_w) back into (N, C, h, w)."""
    xp = get_array_module(col)
    c, kh, kw, n, out_h, out_w = col.shape
    img = xp.zeros((c, n, h + 2 * ph, w + 2 * pw), dtype=col.dtype)
    for i in range(kh):
        rows = _strided(i * dy, sy, out_h)
        for j in range(kw):
            img[:, :, rows, _strided(j * dx, sx, out_w)] += col[:, i, j]
    return xp.ascontiguousarray(img[:, :, ph:ph + h, pw:pw + w].transpose(1, 0, 2, 3))


def im2col(x, kh, kw, sy, sx, ph, pw, dy=1, dx=1):
    """:func:`im2col_cpu` semantics; a device kernel for cupy arrays once one exists."""
    if im2col_gpu is not None and get_array_module(x) is not numpy:
        return im2col_gpu(x, kh, kw, sy, sx, ph, pw, dy, dx)
    return im2col_cpu(x, kh, kw, sy, sx, ph, pw, dy, dx)


def col2im(col, sy, sx, ph, pw, h, w, dy=1, dx=1):
    """:func:`col2im_cpu` semantics; a device kernel for cupy arrays once one exists."""
    if col2im_gpu is not None and get_array_module(col) is not numpy:
        return col2im_gpu(col, sy, sx, ph, pw, h, w, dy, dx)
    return col2im_cpu(col, sy, sx, ph, pw, h, w, dy, dx)
