"""Space-to-depth (kernels.space_to_depth): the blocks and block filters against their definition by padding and
reshaping, on each backend (the host's compiled pass and cupy's strided copies), and their gradients as the exact
adjoints (<A u, v> = <u, A^T v>)."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.kernels.space_to_depth import SpaceToDepth, block_kernel

# (N, C, H, W, geometry): AlexNet's conv1 at its size and at sizes with unread trailing pixels, padding on one or
# both axes, unequal strides, a kernel smaller than its stride's blocks
GEOMETRIES = [
    (2, 3, 227, 227, (11, 11, 4, 4, 0, 0, 1, 1)),
    (1, 3, 30, 29, (11, 11, 4, 4, 0, 0, 1, 1)),
    (2, 2, 13, 12, (5, 5, 2, 2, 2, 2, 1, 1)),
    (1, 2, 12, 14, (7, 8, 3, 3, 1, 2, 1, 1)),
    (2, 2, 10, 9, (5, 3, 2, 1, 1, 1, 1, 1)),
    (1, 1, 9, 9, (6, 6, 2, 2, 3, 0, 1, 1)),
]


def blocks_by_definition(x, geometry, hb, wb):
    """xpad cut into sy x sx blocks, each block's pixels dealt out as channels (c, a, b)."""
    kh, kw, sy, sx, ph, pw = geometry[:6]
    n, c, h, w = x.shape
    padded = numpy.zeros((n, c, max(hb * sy, h + ph), max(wb * sx, w + pw)))
    padded[:, :, ph:ph + h, pw:pw + w] = x
    padded = padded[:, :, :hb * sy, :wb * sx]
    return padded.reshape(n, c, hb, sy, wb, sx).transpose(0, 1, 3, 5, 2, 4).reshape(n, c * sy * sx, hb, wb)


@pytest.mark.parametrize("n,c,h,w,geometry", GEOMETRIES)
def test_blocks_and_filters_equal_their_definition(xp, n, c, h, w, geometry):
    depth = SpaceToDepth(geometry)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w))
    shape = depth.blocks(x.shape)
    xs = depth.images(xp.asarray(x))
    assert xs.shape == shape
    numpy.testing.assert_array_equal(to_numpy(xs), blocks_by_definition(x, geometry, *shape[2:]))
    kh, kw, sy, sx = geometry[:4]
    rh, rw = block_kernel(geometry)
    assert depth.geometry == (rh, rw, 1, 1, 0, 0, 1, 1)
    W = rng.standard_normal((3, c, kh, kw))
    padded = numpy.zeros((3, c, rh * sy, rw * sx))
    padded[:, :, :kh, :kw] = W
    want = padded.reshape(3, c, rh, sy, rw, sx).transpose(0, 1, 3, 5, 2, 4).reshape(3, c * sy * sx, rh, rw)
    numpy.testing.assert_array_equal(to_numpy(depth.filters(xp.asarray(W))), want)


@pytest.mark.parametrize("n,c,h,w,geometry", GEOMETRIES[1:])
def test_gradients_are_the_adjoints(xp, n, c, h, w, geometry):
    depth = SpaceToDepth(geometry)
    rng = numpy.random.default_rng(1)
    x, W = rng.standard_normal((n, c, h, w)), rng.standard_normal((2, c) + tuple(geometry[:2]))
    xs_shape = depth.blocks(x.shape)
    gxs = rng.standard_normal(xs_shape)
    gx = xp.full(x.shape, 9.0)  # overwritten everywhere, the unread pixels with zero
    depth.image_gradient(xp.asarray(gxs), gx)
    assert numpy.isclose(float((x * to_numpy(gx)).sum()), float((to_numpy(depth.images(xp.asarray(x))) * gxs).sum()),
                         rtol=1e-12)
    Ws = to_numpy(depth.filters(xp.asarray(W)))
    gWs = rng.standard_normal(Ws.shape)
    gW = xp.ones(W.shape)
    depth.add_filter_gradient(xp.asarray(gWs), gW)
    assert numpy.isclose(float((W * (to_numpy(gW) - 1)).sum()), float((Ws * gWs).sum()), rtol=1e-12)


def test_dilated_geometry_is_refused():
    with pytest.raises(ValueError, match="undilated"):
        SpaceToDepth((5, 5, 2, 2, 0, 0, 2, 2))
