"""Max and average pooling over NCHW batches, with Caffe's window rules (``pooling_layer.cpp``).

Window (y, x) covers padded rows ``[y sy - ph, y sy - ph + kh)`` and the matching columns. Each body
loops over the kh * kw kernel positions and handles every image, channel and output pixel of that
position in one strided slice. Output sizes come from the caller (``pooling_output_size``), so a
ceil-mode window may reach past the padded image: the padded buffer is made large enough, and the
part beyond the image counts as -inf (MAX) or contributes nothing (AVE).
"""
from ..backend import get_array_module


def _window(i, j, sy, sx, out_h, out_w):
    return (slice(None), slice(None), slice(i, i + sy * (out_h - 1) + 1, sy), slice(j, j + sx * (out_w - 1) + 1, sx))


def _padded_shape(shape, kh, kw, sy, sx, ph, pw, out_h, out_w):
    n, c, h, w = shape
    return n, c, max(h + 2 * ph, (out_h - 1) * sy + kh), max(w + 2 * pw, (out_w - 1) * sx + kw)


def _pad(x, value, kh, kw, sy, sx, ph, pw, out_h, out_w):
    xp = get_array_module(x)
    n, c, h, w = x.shape
    img = xp.full(_padded_shape(x.shape, kh, kw, sy, sx, ph, pw, out_h, out_w), value, dtype=x.dtype)
    img[:, :, ph:ph + h, pw:pw + w] = x
    return img


def max_pooling_forward(x, kh, kw, sy, sx, ph, pw, out_h, out_w):
    """Max over each window.

    Returns:
        ``(y, argmax)``: y (N, C, out_h, out_w) and, per output, the kernel position ``i * kw + j``
        (int32) of the first maximum in raster order, the element Caffe's strict ``>`` keeps.
    """
    xp = get_array_module(x)
    img = _pad(x, -xp.inf, kh, kw, sy, sx, ph, pw, out_h, out_w)
    y = img[_window(0, 0, sy, sx, out_h, out_w)].copy()
    argmax = xp.zeros(y.shape, dtype=xp.int32)
    for i in range(kh):
        for j in range(kw):
            if i == 0 and j == 0:
                continue
            v = img[_window(i, j, sy, sx, out_h, out_w)]
            better = v > y
            y = xp.where(better, v, y)
            argmax = xp.where(better, xp.int32(i * kw + j), argmax)
    return y, argmax


def max_pooling_backward(gy, argmax, x_shape, kh, kw, sy, sx, ph, pw):
    """Route each output gradient to the input element that won its window (sums where windows overlap)."""
    xp = get_array_module(gy)
    n, c, out_h, out_w = gy.shape
    h, w = x_shape[2:]
    gimg = xp.zeros(_padded_shape(x_shape, kh, kw, sy, sx, ph, pw, out_h, out_w), dtype=gy.dtype)
    zero = gy.dtype.type(0)
    for i in range(kh):
        for j in range(kw):
            gimg[_window(i, j, sy, sx, out_h, out_w)] += xp.where(argmax == i * kw + j, gy, zero)
    return xp.ascontiguousarray(gimg[:, :, ph:ph + h, pw:pw + w])


def argmax_to_mask(argmax, x_shape, kw, sy, sx, ph, pw):
    """Caffe's MAX mask: the flat index ``h * W + w`` of each maximum within its (unpadded) input plane."""
    xp = get_array_module(argmax)
    out_h, out_w = argmax.shape[2:]
    width = x_shape[3]
    rows = xp.arange(out_h, dtype=xp.int64)[:, None] * sy - ph + argmax // kw
    cols = xp.arange(out_w, dtype=xp.int64)[None, :] * sx - pw + argmax % kw
    return rows * width + cols


def average_pool_size(h, w, kh, kw, sy, sx, ph, pw, out_h, out_w, xp, dtype):
    """Caffe's AVE divisor per output (out_h, out_w): the window clipped to the padded image, pad included."""
    def extent(size, k, s, p, out):
        start = xp.arange(out, dtype=xp.int64) * s - p
        return xp.minimum(start + k, size + p) - start

    return (extent(h, kh, sy, ph, out_h)[:, None] * extent(w, kw, sx, pw, out_w)[None, :]).astype(dtype)


def average_pooling_forward(x, kh, kw, sy, sx, ph, pw, out_h, out_w):
    """Sum of the image elements in each window divided by :func:`average_pool_size` (padding adds zeros)."""
    xp = get_array_module(x)
    img = _pad(x, 0, kh, kw, sy, sx, ph, pw, out_h, out_w)
    y = xp.zeros((x.shape[0], x.shape[1], out_h, out_w), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            y += img[_window(i, j, sy, sx, out_h, out_w)]
    y /= average_pool_size(x.shape[2], x.shape[3], kh, kw, sy, sx, ph, pw, out_h, out_w, xp, x.dtype)
    return y


def average_pooling_backward(gy, x_shape, kh, kw, sy, sx, ph, pw):
    """Spread each output gradient / pool size evenly over its window; padding takes its share away."""
    xp = get_array_module(gy)
    n, c, out_h, out_w = gy.shape
    h, w = x_shape[2:]
    g = gy / average_pool_size(h, w, kh, kw, sy, sx, ph, pw, out_h, out_w, xp, gy.dtype)
    gimg = xp.zeros(_padded_shape(x_shape, kh, kw, sy, sx, ph, pw, out_h, out_w), dtype=gy.dtype)
    for i in range(kh):
        for j in range(kw):
            gimg[_window(i, j, sy, sx, out_h, out_w)] += g
    return xp.ascontiguousarray(gimg[:, :, ph:ph + h, pw:pw + w])
