"""Max and average pooling over NCHW batches, with Caffe's window rules (``pooling_layer.cpp``).

Window (y, x) covers padded rows ``[y sy - ph, y sy - ph + kh)`` and the matching columns. Output sizes
come from the caller (``pooling_output_size``), so a ceil-mode window may reach past the padded image: the
part beyond the image counts as -inf (MAX) or contributes nothing (AVE).

Max pooling on the CPU is a compiled loop over (image, channel) planes (kernels.threadpool.cpu_kernel): each
output scans its window once, and backward adds each output gradient to its window's winner, where numpy
needed a pass over every output per kernel position (10x torch's time for AlexNet's overlapping 3x3/2). The zoo
nets' windows (3x3 at column stride 2 or 1, 2x2 at 2) have loops compiled with their sizes as constants for the
windows inside the image, 2x faster than the general loop, which does the edges.
Average pooling stays numpy: each body loops over the kh * kw kernel positions and handles every image,
channel and output pixel of that position in one strided slice, with in-place ufuncs (``out=``). Without
padding, when every window lies inside the image (LeNet's 2x2/2, VGG's), the windows are slices of x
itself; when they are also disjoint, backward assigns each window's share instead of accumulating into a
cleared buffer. CPU batches are split over planes or images on the kernel threads (kernels.threadpool);
cupy arrays go to kernels/cuda/pooling.cu (argmax int32).
"""
import numpy

from ..backend import get_array_module
from .threadpool import cpu_kernel, into_contiguous, parallel_for


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


def _direct(shape, kh, kw, sy, sx, ph, pw, out_h, out_w):
    # no padding and every window inside the image: windows are slices of x itself, no padded copy
    return ph == 0 and pw == 0 and (out_h - 1) * sy + kh <= shape[2] and (out_w - 1) * sx + kw <= shape[3]


def _disjoint(shape, kh, kw, sy, sx, ph, pw, out_h, out_w):
    # windows neither overlap nor reach outside the image: each input element has at most one window, so
    # backward assigns instead of accumulating (and skips clearing when the windows tile the image)
    return sy >= kh and sx >= kw and _direct(shape, kh, kw, sy, sx, ph, pw, out_h, out_w)


def _result(out, shape, dtype, xp):
    return xp.empty(shape, dtype=dtype) if out is None else out


def _disjoint_grad(out, x_shape, kh, kw, sy, sx, out_h, out_w, dtype, xp):
    # every window is written once; only elements no window covers need clearing
    gx = _result(out, x_shape, dtype, xp)
    h, w = x_shape[2:]
    if out_h * sy != h or out_w * sx != w or sy != kh or sx != kw:
        gx[...] = 0
    return gx


def max_pooling_forward(x, kh, kw, sy, sx, ph, pw, out_h, out_w, out=None):
    """Max over each window (written into ``out`` when given).

    Returns:
        ``(y, argmax)``: y (N, C, out_h, out_w) and, per output, the kernel position ``i * kw + j``
        (uint8, or int32 beyond 255 positions) of the first maximum in raster order, the element
        Caffe's strict ``>`` keeps (positions outside the image count as -inf).
    """
    xp = get_array_module(x)
    if xp is not numpy:  # kernels/cuda/pooling.cu
        from .cuda import pooling as gpu
        return gpu.max_pooling_forward_gpu(x, kh, kw, sy, sx, ph, pw, out_h, out_w, out)
    shape = (x.shape[0], x.shape[1], out_h, out_w)
    y = _result(out, shape, x.dtype, xp)
    argmax = xp.empty(shape, dtype=xp.uint8 if kh * kw <= 256 else xp.int32)
    planes, argmax_planes = _planes(numpy.ascontiguousarray(x)), _planes(argmax)
    window = _MAX_FORWARD_WINDOWS.get((kh, kw, sx))
    h, w = x.shape[2:]
    if window is None:  # every output by the general loop
        strips = [(0, out_h, 0, out_w)]
    else:  # the outputs whose windows lie inside the image by the compiled window, the edges' by the general loop
        oy0, ox0 = -(-ph // sy), -(-pw // sx)
        oy1, ox1 = max(oy0, min(out_h, (h + ph - kh) // sy + 1)), max(ox0, min(out_w, (w + pw - kw) // sx + 1))
        inside = (oy0, oy1, ox0, ox1)
        strips = [(0, oy0, 0, out_w), (oy1, out_h, 0, out_w), (oy0, oy1, 0, ox0), (oy0, oy1, ox1, out_w)]

    def body(lo, hi, target):
        if window is not None:
            window(planes, sy, ph, pw, *inside, lo, hi, target, argmax_planes)
        for strip in strips:
            _max_forward(planes, kh, kw, sy, sx, ph, pw, *strip, lo, hi, target, argmax_planes)
    into_contiguous(y, lambda target: parallel_for(len(planes), lambda lo, hi: body(lo, hi, _planes(target)),
                                                   work=y.size))
    return y, argmax


def _planes(a):
    return a.reshape(-1, a.shape[-2], a.shape[-1])  # (N C, H, W): the kernels loop over planes


@cpu_kernel
def _max_forward(x, kh, kw, sy, sx, ph, pw, oy0, oy1, ox0, ox1, lo, hi, y, argmax):
    # the outputs [oy0, oy1) x [ox0, ox1) of planes [lo, hi), any window
    _, h, w = x.shape
    for p in range(lo, hi):
        for oy in range(oy0, oy1):
            top = oy * sy - ph
            for ox in range(ox0, ox1):
                left = ox * sx - pw
                best = -numpy.inf  # positions outside the image: -inf, which never wins a strict >
                arg = 0
                for r in range(max(top, 0), min(top + kh, h)):
                    for c in range(max(left, 0), min(left + kw, w)):
                        if x[p, r, c] > best:
                            best = x[p, r, c]
                            arg = (r - top) * kw + c - left
                y[p, oy, ox] = best
                argmax[p, oy, ox] = arg


def _max_forward_window(kh, kw, sx):
    """_max_forward for one window size and column stride, compiled with them as constants, for the outputs whose
    windows lie inside the image. A row of outputs at a time: for each window position in raster order, one pass
    along the row's outputs (a unit-stride run of best values and positions, the input at stride sx), which the
    compiler vectorises; each output still takes its window's elements in raster order with a strict >, so the
    results are the scalar loop's. ResNet-50's 3x3/2 pool1 at batch 8 (64 x 112 x 112, 2 threads): 6.5 ms against
    11-17 for a scalar chain of selects per output (AlexNet's pool1 took 8 ms that way where the general loop
    took 18)."""
    @cpu_kernel
    def body(x, sy, ph, pw, oy0, oy1, ox0, ox1, lo, hi, y, argmax):
        width = ox1 - ox0
        best = numpy.empty(width, x.dtype)
        arg = numpy.empty(width, numpy.int32)  # as wide as the values: a uint8 run kept the loop scalar
        for p in range(lo, hi):
            for oy in range(oy0, oy1):
                top = oy * sy - ph
                for k in range(width):  # (loops: numba's slice assignments cost more than the pass)
                    best[k] = -numpy.inf  # so that a NaN never wins, as in _max_forward
                    arg[k] = 0
                for i in range(kh):
                    for j in range(kw):
                        row = x[p, top + i, ox0 * sx - pw + j:]  # a view from index 0: no negative-index checks
                        for k in range(width):
                            v = row[sx * k]
                            wins = v > best[k]
                            best[k] = v if wins else best[k]
                            arg[k] = i * kw + j if wins else arg[k]
                for k in range(width):
                    y[p, oy, ox0 + k] = best[k]
                    argmax[p, oy, ox0 + k] = arg[k]
    return body


# the max-pooling windows (kh, kw, column stride) of the zoo nets, compiled with their sizes as constants
_MAX_FORWARD_WINDOWS = {key: _max_forward_window(*key) for key in ((3, 3, 2), (2, 2, 2), (3, 3, 1))}


def max_pooling_backward(gy, argmax, x_shape, kh, kw, sy, sx, ph, pw, out=None):
    """Route each output gradient to the input element that won its window (sums where windows overlap)."""
    xp = get_array_module(gy)
    if xp is not numpy:  # kernels/cuda/pooling.cu
        from .cuda import pooling as gpu
        return gpu.max_pooling_backward_gpu(gy, argmax, x_shape, kh, kw, sy, sx, ph, pw, out)
    gx = _result(out, x_shape, gy.dtype, xp)
    gy_planes, argmax_planes = _planes(numpy.ascontiguousarray(gy)), _planes(numpy.ascontiguousarray(argmax))
    # each window position's row and column: looked up, where a division by the run-time kw per output cost ResNet-50's
    # pool1 at batch 8 (2 threads) 5.4-6.7 ms against 3.3-3.7
    rows, columns = numpy.divmod(numpy.arange(kh * kw, dtype=numpy.int64), kw)
    return into_contiguous(gx, lambda target: parallel_for(len(gy_planes), lambda lo, hi: _max_backward(
        gy_planes, argmax_planes, rows, columns, sy, sx, ph, pw, lo, hi, _planes(target)), work=gx.size))


@cpu_kernel
def _max_backward(gy, argmax, rows, columns, sy, sx, ph, pw, lo, hi, gx):
    _, h, w = gx.shape
    _, out_h, out_w = gy.shape
    for p in range(lo, hi):
        gx[p] = 0
        for oy in range(out_h):
            for ox in range(out_w):
                k = argmax[p, oy, ox]
                r = oy * sy - ph + rows[k]
                c = ox * sx - pw + columns[k]
                if 0 <= r < h and 0 <= c < w:  # a window of padding only has no winner
                    gx[p, r, c] += gy[p, oy, ox]


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


def average_pooling_forward(x, kh, kw, sy, sx, ph, pw, out_h, out_w, out=None):
    """Sum of the image elements in each window divided by :func:`average_pool_size` (padding adds zeros)."""
    xp = get_array_module(x)
    if xp is not numpy:  # kernels/cuda/pooling.cu
        from .cuda import pooling as gpu
        return gpu.average_pooling_forward_gpu(x, kh, kw, sy, sx, ph, pw, out_h, out_w, out)
    y = _result(out, (x.shape[0], x.shape[1], out_h, out_w), x.dtype, xp)
    parallel_for(len(x), lambda lo, hi: _average_forward(x[lo:hi], kh, kw, sy, sx, ph, pw, out_h, out_w, y[lo:hi]),
                 work=y.size)
    return y


def _average_forward(x, kh, kw, sy, sx, ph, pw, out_h, out_w, y):
    xp = numpy
    direct = _direct(x.shape, kh, kw, sy, sx, ph, pw, out_h, out_w)
    img = x if direct else _pad(x, 0, kh, kw, sy, sx, ph, pw, out_h, out_w)
    y[...] = img[_window(0, 0, sy, sx, out_h, out_w)]
    for i in range(kh):
        for j in range(kw):
            if i or j:
                y += img[_window(i, j, sy, sx, out_h, out_w)]
    if direct:  # every window is whole: one divisor
        y *= x.dtype.type(1.0 / (kh * kw))
    else:
        y /= average_pool_size(x.shape[2], x.shape[3], kh, kw, sy, sx, ph, pw, out_h, out_w, xp, x.dtype)


def average_pooling_backward(gy, x_shape, kh, kw, sy, sx, ph, pw, out=None):
    """Spread each output gradient / pool size evenly over its window; padding takes its share away."""
    xp = get_array_module(gy)
    if xp is not numpy:  # kernels/cuda/pooling.cu
        from .cuda import pooling as gpu
        return gpu.average_pooling_backward_gpu(gy, x_shape, kh, kw, sy, sx, ph, pw, out)
    gx = _result(out, x_shape, gy.dtype, xp)
    parallel_for(len(gy), lambda lo, hi: _average_backward(gy[lo:hi], (hi - lo,) + tuple(x_shape[1:]), kh, kw, sy,
                                                           sx, ph, pw, gx[lo:hi]), work=gy.size)
    return gx


def _average_backward(gy, x_shape, kh, kw, sy, sx, ph, pw, out):
    xp = numpy
    n, c, out_h, out_w = gy.shape
    h, w = x_shape[2:]
    if _direct(x_shape, kh, kw, sy, sx, ph, pw, out_h, out_w):
        g = gy * gy.dtype.type(1.0 / (kh * kw))
    else:
        g = gy / average_pool_size(h, w, kh, kw, sy, sx, ph, pw, out_h, out_w, xp, gy.dtype)
    if _disjoint(x_shape, kh, kw, sy, sx, ph, pw, out_h, out_w):
        gx = _disjoint_grad(out, x_shape, kh, kw, sy, sx, out_h, out_w, gy.dtype, xp)
        for i in range(kh):
            for j in range(kw):
                gx[_window(i, j, sy, sx, out_h, out_w)] = g
        return gx
    gimg = xp.zeros(_padded_shape(x_shape, kh, kw, sy, sx, ph, pw, out_h, out_w), dtype=gy.dtype)
    for i in range(kh):
        for j in range(kw):
            gimg[_window(i, j, sy, sx, out_h, out_w)] += g
    gx = _result(out, x_shape, gy.dtype, xp)
    gx[...] = gimg[:, :, ph:ph + h, pw:pw + w]
    return gx


def stochastic_pooling_forward(x, kh, kw, sy, sx, out_h, out_w, uniform=None, out=None):
    """Caffe's stochastic pooling (no padding): each window's output is one of its elements, drawn with
    probability proportional to its (non-negative) value in TRAIN, or in TEST (``uniform`` None) the
    probability-weighted mean sum(x^2) / sum(x) (0 for an all-zero window).

    ``uniform`` (N, C, out_h, out_w) values in [0, 1) make the draws: the first element in raster order
    whose running sum reaches ``uniform * sum(x)`` wins, as in Caffe's kernel. Returns ``(y, index)`` with
    index the winner's kernel position ``i * kw + j`` (None in TEST), the format of max pooling's argmax.
    """
    xp = get_array_module(x)
    img = x if _direct(x.shape, kh, kw, sy, sx, 0, 0, out_h, out_w) else \
        _pad(x, 0, kh, kw, sy, sx, 0, 0, out_h, out_w)
    y = _result(out, (x.shape[0], x.shape[1], out_h, out_w), x.dtype, xp)
    taps = [(i * kw + j, img[_window(i, j, sy, sx, out_h, out_w)]) for i in range(kh) for j in range(kw)]
    total = sum(v for _, v in taps)
    if uniform is None:
        squares = sum(v * v for _, v in taps)
        y[...] = xp.where(total > 0, squares / xp.where(total > 0, total, 1), 0)
        return y, None
    threshold = uniform * total
    index = xp.zeros(y.shape, dtype=xp.int32)
    running = xp.zeros(y.shape, dtype=x.dtype)
    found = xp.zeros(y.shape, dtype=bool)
    for k, v in taps:
        running += v
        hit = (running >= threshold) & ~found
        xp.copyto(index, k, where=hit)
        xp.copyto(y, v, where=hit)
        found |= hit
    return y, index
