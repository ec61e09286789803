import itertools

import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.kernels.im2col import col2im, col2im_nd, conv_output_shape, im2col, im2col_cpu, im2col_nd
from layerforge.kernels.output_size import conv_output_size, pooling_output_size


def naive_im2col(x, kh, kw, sy, sx, ph, pw, dy, dx):
    n, c, h, w = x.shape
    out_h, out_w = conv_output_size(h, kh, sy, ph, dy), conv_output_size(w, kw, sx, pw, dx)
    col = numpy.zeros((c, kh, kw, n, out_h, out_w), x.dtype)
    for i in range(kh):
        for j in range(kw):
            for y in range(out_h):
                for xo in range(out_w):
                    r, s = y * sy - ph + i * dy, xo * sx - pw + j * dx
                    if 0 <= r < h and 0 <= s < w:
                        col[:, i, j, :, y, xo] = x[:, :, r, s].T
    return col


GEOMETRIES = [  # kh, kw, sy, sx, ph, pw, dy, dx
    (3, 3, 1, 1, 0, 0, 1, 1),
    (3, 3, 2, 2, 1, 1, 1, 1),
    (1, 1, 1, 1, 0, 0, 1, 1),
    (2, 3, 1, 2, 1, 0, 1, 1),
    (3, 3, 1, 1, 2, 2, 2, 2),
    (3, 2, 3, 1, 0, 2, 2, 1),
]


@pytest.mark.parametrize("size", [(7, 7), (6, 9)])
@pytest.mark.parametrize("geom", GEOMETRIES)
def test_im2col_matches_naive_gather(xp, geom, size):
    x = numpy.random.default_rng(0).standard_normal((2, 3) + size)
    col = im2col(xp.asarray(x), *geom)
    numpy.testing.assert_array_equal(to_numpy(col), naive_im2col(x, *geom))


@pytest.mark.parametrize("geom", GEOMETRIES)
def test_col2im_is_the_adjoint_of_im2col(xp, geom):
    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((2, 3, 7, 6))
    col = im2col(xp.asarray(x), *geom)
    c = rng.standard_normal(col.shape)
    kh, kw, sy, sx, ph, pw, dy, dx = geom
    back = col2im(xp.asarray(c), sy, sx, ph, pw, 7, 6, dy, dx)
    assert back.shape == x.shape
    lhs = float((col * xp.asarray(c)).sum())
    rhs = float((xp.asarray(x) * back).sum())
    assert lhs == pytest.approx(rhs, rel=1e-12)


def test_im2col_hand_values():
    x = numpy.arange(9, dtype=numpy.float32).reshape(1, 1, 3, 3)
    col = im2col_cpu(x, 2, 2, 1, 1, 0, 0)
    assert col.shape == (1, 2, 2, 1, 2, 2) and col.dtype == numpy.float32
    numpy.testing.assert_array_equal(col[0, 0, 0, 0], [[0, 1], [3, 4]])
    numpy.testing.assert_array_equal(col[0, 1, 1, 0], [[4, 5], [7, 8]])
    padded = im2col_cpu(x, 3, 3, 2, 2, 1, 1)  # 3x3/2 pad 1 -> 2x2 outputs
    numpy.testing.assert_array_equal(padded[0, 0, 0, 0], [[0, 0], [0, 4]])
    numpy.testing.assert_array_equal(padded[0, 1, 1, 0], [[0, 2], [6, 8]])
    # col2im counts how many windows touch each pixel
    counts = col2im(numpy.ones_like(col), 1, 1, 0, 0, 3, 3)
    numpy.testing.assert_array_equal(counts[0, 0], [[1, 2, 1], [2, 4, 2], [1, 2, 1]])


@pytest.mark.parametrize("args, expected", [
    ((5, 3, 1, 0, 1), 3), ((7, 3, 2, 1, 1), 4), ((7, 3, 1, 0, 2), 3), ((227, 11, 4, 0, 1), 55),
    ((224, 7, 2, 3, 1), 112), ((6, 3, 2, 0, 1), 2), ((5, 1, 2, 0, 1), 3),
])
def test_conv_output_size_floor(args, expected):
    assert conv_output_size(*args) == expected


@pytest.mark.parametrize("args, expected", [
    ((6, 3, 2, 0), 3),      # ceil: Caffe's 3x3/2 on 6x6 gives 3x3 (floor would give 2)
    ((55, 3, 2, 0), 27),    # AlexNet pool1
    ((112, 3, 2, 0), 56),   # GoogLeNet pool1 (ceil((112-3)/2)+1)
    ((7, 3, 2, 0), 3),
    ((3, 2, 2, 1), 2),      # ceil gives 3, but the third window would start in the pad: dropped
    ((4, 2, 2, 1), 3),
    ((5, 5, 1, 0), 1),
    ((3, 3, 1, 1), 3),
])
def test_pooling_output_size_caffe_ceil(args, expected):
    assert pooling_output_size(*args) == expected


def test_pooling_output_size_floor_mode():
    assert pooling_output_size(6, 3, 2, 0, ceil_mode=False) == 2
    assert pooling_output_size(7, 3, 2, 0, ceil_mode=False) == 3


# ---- N-d im2col / col2im ----

ND_GEOMETRIES = [  # kernel, stride, pad, dilation
    ((3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1)),
    ((2, 3, 1), (2, 1, 3), (1, 0, 1), (1, 2, 1)),
    ((3,), (2,), (1,), (2,)),
    ((2, 2, 2, 2), (1, 2, 1, 2), (0, 1, 1, 0), (1, 1, 1, 1)),
]


def naive_im2col_nd(x, kernel, stride, pad, dilation):
    n, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
    out = conv_output_shape(spatial, kernel, stride, pad, dilation)
    col = numpy.zeros((c,) + kernel + (n,) + out, x.dtype)
    for j in itertools.product(*map(range, kernel)):
        for o in itertools.product(*map(range, out)):
            src = tuple(oo * s - p + jj * d for oo, s, p, jj, d in zip(o, stride, pad, j, dilation))
            if all(0 <= v < size for v, size in zip(src, spatial)):
                col[(slice(None),) + j + (slice(None),) + o] = x[(slice(None), slice(None)) + src].T
    return col


@pytest.mark.parametrize("geom", ND_GEOMETRIES)
def test_im2col_nd_matches_naive_gather_and_col2im_nd_is_its_adjoint(xp, geom):
    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((2, 3) + (5, 6, 4, 3)[:len(geom[0])])
    col = im2col_nd(xp.asarray(x), *geom)
    expected = naive_im2col_nd(x, *geom)
    numpy.testing.assert_array_equal(to_numpy(col), expected)
    # <im2col(x), c> == <x, col2im(c)> for a random c: col2im_nd is the transpose of im2col_nd
    c = rng.standard_normal(expected.shape)
    gx = to_numpy(col2im_nd(xp.asarray(c), *geom[1:], x.shape[2:]))
    assert gx.shape == x.shape
    numpy.testing.assert_allclose((expected * c).sum(), (x * gx).sum(), rtol=1e-12)


@pytest.mark.parametrize("geom", GEOMETRIES)
def test_im2col_nd_on_two_axes_is_the_2d_im2col(xp, geom):
    kh, kw, sy, sx, ph, pw, dy, dx = geom
    x = xp.asarray(numpy.random.default_rng(2).standard_normal((2, 3, 7, 8)))
    col = im2col_nd(x, (kh, kw), (sy, sx), (ph, pw), (dy, dx))
    numpy.testing.assert_array_equal(to_numpy(col), to_numpy(im2col(x, *geom)))
    numpy.testing.assert_allclose(to_numpy(col2im_nd(col, (sy, sx), (ph, pw), (dy, dx), (7, 8))),
                                  to_numpy(col2im(col, sy, sx, ph, pw, 7, 8, dy, dx)), rtol=1e-12)


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("geom, size", [
    (g, s) for g in GEOMETRIES + [(7, 7, 2, 2, 3, 3, 1, 1), (5, 5, 4, 3, 6, 1, 1, 1), (3, 3, 1, 1, 1, 1, 1, 1),
                                  (5, 5, 1, 1, 2, 2, 1, 1), (3, 5, 2, 3, 1, 4, 1, 2)] for s in [(7, 7), (6, 9), (2, 11)]
    if conv_output_size(s[0], g[0], g[2], g[4], g[6]) > 0 and conv_output_size(s[1], g[1], g[3], g[5], g[7]) > 0]
    + [((11, 11, 4, 4, 0, 0, 1, 1), (27, 31)), ((11, 11, 4, 4, 2, 3, 1, 1), (15, 12))])  # AlexNet's conv1, padded
def test_compiled_tiles_give_the_slicing_bodies_bits(monkeypatch, geom, size, dtype):
    """The engines' layouts ((n, C, H, W) images, (n, C, kh, kw, rows, out_w) columns behind the views) go to the
    compiled loops: the same columns as the slicing bodies, every element written (a reused buffer holds garbage),
    and col2im adds each element's taps in the same order, so the same bits; for the whole image and for row tiles."""
    from layerforge.kernels import im2col as module

    kh, kw, sy, sx, ph, pw, dy, dx = geom
    h, w = size
    out_h, out_w = conv_output_size(h, kh, sy, ph, dy), conv_output_size(w, kw, sx, pw, dx)
    calls = []
    for name in ("_im2col_compiled", "_col2im_compiled"):
        monkeypatch.setattr(module, name, lambda *a, fn=getattr(module, name), name=name: calls.append(name) or fn(*a))
    rng = numpy.random.default_rng(7)
    x = rng.standard_normal((3, 4, h, w)).astype(dtype)
    for r0, rows in [(0, out_h), (out_h // 2, out_h - out_h // 2), (out_h - 1, 1)]:
        expected = numpy.empty((4, kh, kw, 3, rows, out_w), dtype)
        module._im2col_slice(x.transpose(1, 0, 2, 3), expected, *geom, r0)
        col = numpy.full((3, 4, kh, kw, rows, out_w), numpy.nan, dtype)
        module.im2col_tile(x.transpose(1, 0, 2, 3), col.transpose(1, 2, 3, 0, 4, 5), *geom, r0=r0)
        numpy.testing.assert_array_equal(col.transpose(1, 2, 3, 0, 4, 5), expected)
        grad = rng.standard_normal(col.shape).astype(dtype)
        start = rng.standard_normal(x.shape).astype(dtype)
        expected_gx = start.transpose(1, 0, 2, 3).copy()
        module._col2im_slice(grad.transpose(1, 2, 3, 0, 4, 5), expected_gx, *geom, r0)
        gx = start.copy()
        module.col2im_tile(grad.transpose(1, 2, 3, 0, 4, 5), gx.transpose(1, 0, 2, 3), *geom, r0=r0)
        numpy.testing.assert_array_equal(gx.transpose(1, 0, 2, 3), expected_gx)
    assert calls == ["_im2col_compiled", "_col2im_compiled"] * 3
