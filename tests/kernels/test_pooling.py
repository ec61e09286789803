import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.kernels import pooling
from layerforge.kernels.output_size import pooling_output_size


def caffe_pooling(x, gy, pool, kh, kw, sy, sx, ph, pw):
    """Caffe's pooling_layer.cpp loops, literally: forward top (+ mask for MAX) and backward bottom diff."""
    n, c, h, w = x.shape
    padded = ph > 0 or pw > 0  # Caffe clips both axes' last windows when either axis is padded
    out_h, out_w = pooling_output_size(h, kh, sy, ph, True, padded), pooling_output_size(w, kw, sx, pw, True, padded)
    top = numpy.zeros((n, c, out_h, out_w))
    mask = numpy.full(top.shape, -1)
    gx = numpy.zeros_like(x)
    for b in range(n):
        for ch in range(c):
            for py in range(out_h):
                for px in range(out_w):
                    hs, ws = py * sy - ph, px * sx - pw
                    he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
                    size = (he - hs) * (we - ws)
                    hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
                    g = gy[b, ch, py, px]
                    if pool == "MAX":
                        best = -numpy.inf
                        for r in range(hs, he):
                            for s in range(ws, we):
                                if x[b, ch, r, s] > best:
                                    best, mask[b, ch, py, px] = x[b, ch, r, s], r * w + s
                        top[b, ch, py, px] = best
                        m = mask[b, ch, py, px]
                        gx[b, ch, m // w, m % w] += g
                    else:
                        top[b, ch, py, px] = x[b, ch, hs:he, ws:we].sum() / size
                        gx[b, ch, hs:he, ws:we] += g / size
    return top, mask, gx


GEOMETRIES = [  # kh, kw, sy, sx, ph, pw
    (3, 3, 2, 2, 0, 0),   # ceil mode: last window hangs over the edge
    (2, 2, 2, 2, 0, 0),
    (3, 3, 1, 1, 1, 1),
    (3, 3, 2, 2, 1, 1),
    (2, 3, 1, 2, 1, 0),
    (3, 2, 3, 3, 2, 1),
    (4, 4, 3, 3, 0, 0),
]


@pytest.mark.parametrize("size", [(6, 6), (7, 5)])
@pytest.mark.parametrize("geom", GEOMETRIES)
@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_pooling_matches_caffe_loops(xp, pool, geom, size):
    rng = numpy.random.default_rng(3)
    x = rng.permutation(2 * 3 * size[0] * size[1]).reshape((2, 3) + size).astype(numpy.float64)
    kh, kw, sy, sx, ph, pw = geom
    out_h, out_w = pooling_output_size(size[0], kh, sy, ph), pooling_output_size(size[1], kw, sx, pw)
    gy = rng.standard_normal((2, 3, out_h, out_w))
    top, mask, gx = caffe_pooling(x, gy, pool, *geom)
    if pool == "MAX":
        y, argmax = pooling.max_pooling_forward(xp.asarray(x), *geom, out_h, out_w)
        numpy.testing.assert_array_equal(to_numpy(pooling.argmax_to_mask(argmax, x.shape, kw, sy, sx, ph, pw)), mask)
        g = pooling.max_pooling_backward(xp.asarray(gy), argmax, x.shape, *geom)
    else:
        y = pooling.average_pooling_forward(xp.asarray(x), *geom, out_h, out_w)
        g = pooling.average_pooling_backward(xp.asarray(gy), x.shape, *geom)
    numpy.testing.assert_allclose(to_numpy(y), top, rtol=1e-12)
    numpy.testing.assert_allclose(to_numpy(g), gx, rtol=1e-12, atol=1e-14)


def test_max_ties_keep_the_first_in_raster_order():
    x = numpy.ones((1, 1, 2, 2), numpy.float32)
    y, argmax = pooling.max_pooling_forward(x, 2, 2, 1, 1, 0, 0, 1, 1)
    assert argmax.ravel().tolist() == [0] and y.dtype == numpy.float32
    g = pooling.max_pooling_backward(numpy.ones((1, 1, 1, 1), numpy.float32), argmax, x.shape, 2, 2, 1, 1, 0, 0)
    numpy.testing.assert_array_equal(g[0, 0], [[1, 0], [0, 0]])


def test_average_pool_size_counts_padding_up_to_the_padded_edge():
    # 3x3/1 pad 1 on 3x3: every window lies inside the padded 5x5 image, so all divisors are 9
    size = pooling.average_pool_size(3, 3, 3, 3, 1, 1, 1, 1, 3, 3, numpy, numpy.float64)
    numpy.testing.assert_array_equal(size, numpy.full((3, 3), 9.0))
    # 3x3/2 on 6x6 (ceil: 3 outputs): the last window covers rows 4..5 only -> 2 rows
    size = pooling.average_pool_size(6, 6, 3, 3, 2, 2, 0, 0, 3, 3, numpy, numpy.float64)
    numpy.testing.assert_array_equal(size, [[9, 9, 6], [9, 9, 6], [6, 6, 4]])


@pytest.mark.parametrize("window", sorted(pooling._MAX_FORWARD_WINDOWS))
@pytest.mark.parametrize("sy,ph,pw,size", [(2, 0, 0, (13, 13)), (1, 1, 0, (8, 11)), (3, 1, 1, (7, 10)), (2, 0, 1, (4, 5))])
def test_max_windows_compiled_with_their_sizes_equal_the_general_loop(window, sy, ph, pw, size):
    """The window sizes compiled as constants (pooling._MAX_FORWARD_WINDOWS), for the windows inside the image, and the
    general loop for the edges' give the general loop's maxima and winners bit for bit: ties (the first in raster
    order), NaN (never wins), -inf, padding, ceil mode's windows past the edge."""
    kh, kw, sx = window
    rng = numpy.random.default_rng(7)
    x = numpy.round(rng.standard_normal((3, 4) + size)).astype(numpy.float32)
    x.ravel()[rng.choice(x.size, 20, replace=False)] = numpy.nan
    x.ravel()[rng.choice(x.size, 20, replace=False)] = -numpy.inf
    x[0, 0] = numpy.nan  # a plane of NaN only: every maximum -inf, every winner 0
    out_h, out_w = pooling_output_size(size[0], kh, sy, ph), pooling_output_size(size[1], kw, sx, pw)
    shape = (12, out_h, out_w)
    planes = x.reshape((12,) + size)
    want_y, want_arg = numpy.empty(shape, numpy.float32), numpy.empty(shape, numpy.uint8)
    pooling._max_forward(planes, kh, kw, sy, sx, ph, pw, 0, out_h, 0, out_w, 0, 12, want_y, want_arg)
    got_y, got_arg = pooling.max_pooling_forward(x, kh, kw, sy, sx, ph, pw, out_h, out_w)
    assert got_y.tobytes() == want_y.tobytes() and got_arg.tobytes() == want_arg.tobytes()
    assert numpy.isneginf(got_y[0, 0]).all() and not (got_arg[0, 0]).any()
