import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def pool_layer(top=("top",), xp=numpy, **param):
    return create_layer({"type": "Pooling", "top": list(top), "pooling": param}, dtype=numpy.float64, xp=xp)


def run(layer, x, n_top=1, xp=numpy):
    bottom = [Blob(x.shape, numpy.float64, xp)]
    bottom[0].data[...] = xp.asarray(x)
    top = [Blob((), numpy.float64, xp) for _ in range(n_top)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return bottom, top


def test_caffe_forward_max_with_mask(xp):
    # Caffe's test_pooling_layer.cpp TestForwardMax: 2x2 windows, stride 1, on a 3x5 plane
    plane = numpy.array([[1, 2, 5, 2, 3], [9, 4, 1, 4, 8], [1, 2, 5, 2, 3]], numpy.float64)
    x = numpy.broadcast_to(plane, (2, 2, 3, 5)).copy()
    layer = pool_layer(top=("y", "mask"), xp=xp, pool="MAX", kernel_size=2, stride=1)
    _, top = run(layer, x, 2, xp)
    assert top[0].shape == (2, 2, 2, 4)
    numpy.testing.assert_array_equal(to_numpy(top[0].data)[1, 1], [[9, 5, 5, 8], [9, 5, 5, 8]])
    numpy.testing.assert_array_equal(to_numpy(top[1].data)[0, 1], [[5, 2, 2, 9], [5, 12, 12, 9]])


def test_caffe_forward_max_padded():
    # Caffe's TestForwardMaxPadded: 3x3 windows, stride 2, pad 2 -> 3x3 output
    x = numpy.array([[1, 2, 4], [2, 3, 2], [4, 2, 1]], numpy.float64).reshape(1, 1, 3, 3)
    _, top = run(pool_layer(pool="MAX", kernel_size=3, stride=2, pad=2), x)
    numpy.testing.assert_array_equal(top[0].data[0, 0], [[1, 4, 4], [4, 4, 4], [4, 4, 1]])


def test_caffe_forward_ave_padded_divides_by_the_padded_window(xp):
    # Caffe's TestForwardAve: 3x3 windows, stride 1, pad 1 on a constant 2: corners 8/9, edges 12/9, centre 2
    layer = pool_layer(xp=xp, pool="AVE", kernel_size=3, stride=1, pad=1)
    _, top = run(layer, numpy.full((1, 1, 3, 3), 2.0), xp=xp)
    e = 4.0 / 3
    numpy.testing.assert_allclose(to_numpy(top[0].data)[0, 0], [[8 / 9, e, 8 / 9], [e, 2, e], [8 / 9, e, 8 / 9]])


def test_ave_window_past_the_edge_divides_by_its_clipped_size():
    # 3x3/2 on 6x6 (ceil -> 3x3): the last row/column of windows covers 2 image rows/columns only
    x = numpy.arange(36.0).reshape(1, 1, 6, 6)
    _, top = run(pool_layer(pool="AVE", kernel_size=3, stride=2), x)
    assert top[0].data[0, 0, 2, 2] == pytest.approx((28 + 29 + 34 + 35) / 4)
    assert top[0].data[0, 0, 0, 2] == pytest.approx((4 + 5 + 10 + 11 + 16 + 17) / 6)
    assert top[0].data[0, 0, 0, 0] == pytest.approx((0 + 1 + 2 + 6 + 7 + 8 + 12 + 13 + 14) / 9)


@pytest.mark.parametrize("param, shape, out", [
    ({"kernel_size": 3, "stride": 2}, (2, 3, 6, 5), (2, 3, 3, 2)),            # Caffe TestSetup
    ({"kernel_size": 3, "stride": 2, "pad": 1}, (2, 3, 6, 5), (2, 3, 4, 3)),  # Caffe TestSetupPadded
    ({"kernel_size": 3, "stride": 2, "round_mode": "FLOOR"}, (1, 1, 6, 6), (1, 1, 2, 2)),
    ({"kernel_size": 2, "stride": 2, "pad": 1}, (1, 1, 3, 3), (1, 1, 2, 2)),  # third window would start in the pad
    ({"kernel_h": 3, "kernel_w": 2, "stride_h": 1, "stride_w": 2}, (1, 2, 5, 5), (1, 2, 3, 3)),
    ({"global_pooling": True}, (2, 3, 6, 5), (2, 3, 1, 1)),
])
def test_output_shapes(param, shape, out):
    _, top = run(pool_layer(**param), numpy.zeros(shape))
    assert top[0].shape == out


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_global_pooling_hand_values(pool):
    x = numpy.arange(24.0).reshape(1, 2, 3, 4)
    _, top = run(pool_layer(pool=pool, global_pooling=True), x)
    expected = [11.0, 23.0] if pool == "MAX" else [5.5, 17.5]
    numpy.testing.assert_allclose(top[0].data.ravel(), expected)


@pytest.mark.parametrize("param", [
    {"kernel_size": 3, "stride": 2},
    {"kernel_size": 3, "stride": 2, "pad": 1},
    {"kernel_size": 2, "stride": 2},
    {"kernel_size": 3, "stride": 1, "pad": 1},
    {"kernel_h": 3, "kernel_w": 2, "stride_h": 2, "stride_w": 1, "pad_h": 1, "pad_w": 1},
    {"kernel_size": 4, "stride": 3},
])
@pytest.mark.parametrize("shape", [(2, 3, 7, 7), (1, 2, 6, 9)])
@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_matches_torch_ceil_mode(pool, param, shape):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal(shape)
    layer = pool_layer(top=("y", "mask") if pool == "MAX" else ("y",), pool=pool, **param)
    bottom, top = run(layer, x, 2 if pool == "MAX" else 1)
    top[0].diff[...] = rng.standard_normal(top[0].shape)
    layer.backward(top, [True], bottom)
    k, s, p = (layer.kh, layer.kw), (layer.sy, layer.sx), (layer.ph, layer.pw)
    xt = torch.tensor(x, requires_grad=True)
    if pool == "MAX":
        y, idx = F.max_pool2d(xt, k, s, p, ceil_mode=True, return_indices=True)
        numpy.testing.assert_array_equal(top[1].data, idx.numpy())
    else:
        y = F.avg_pool2d(xt, k, s, p, ceil_mode=True, count_include_pad=True)
    (y * torch.tensor(top[0].diff)).sum().backward()
    numpy.testing.assert_allclose(top[0].data, y.detach().numpy(), rtol=1e-12)
    numpy.testing.assert_allclose(bottom[0].diff, xt.grad.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("param", [
    {"kernel_size": 3, "stride": 2},
    {"kernel_size": 3, "stride": 2, "pad": 2},
    {"kernel_size": 2, "stride": 1, "pad": 1},
    {"global_pooling": True},
])
@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_gradient_check(pool, param):
    # distinct values 0.05 apart, so the finite-difference step never changes which element wins
    x = numpy.random.default_rng(2).permutation(2 * 2 * 6 * 5).reshape(2, 2, 6, 5) * 0.05
    layer = pool_layer(pool=pool, **param)
    assert check_gradient(layer, [make_blob(x)], [Blob((), numpy.float64)]) > 0


@pytest.mark.parametrize("param, top, message", [
    ({"pool": "STOCHASTIC", "kernel_size": 2, "pad": 1}, ("y",), "STOCHASTIC pooling takes no padding"),
    ({"pool": "AVE", "kernel_size": 2}, ("y", "mask"), "only MAX pooling has a second"),
    ({"global_pooling": True, "kernel_size": 2}, ("y",), "give no kernel size"),
    ({"global_pooling": True, "stride": 2}, ("y",), "stride 1"),
    ({"kernel_size": 2, "pad": 2}, ("y",), "smaller than the kernel"),
    ({"stride": 2}, ("y",), "required: kernel_size"),
    ({"kernel_h": 2}, ("y",), "give both kernel_h and kernel_w"),
    ({"kernel_size": 2, "stride": 2, "stride_h": 2, "stride_w": 2}, ("y",), "not both"),
])
def test_config_errors(param, top, message):
    with pytest.raises(ConfigError, match=message):
        pool_layer(top=top, **param)


def test_shape_errors():
    with pytest.raises(ShapeError, match="4-D bottom"):
        pool_layer(kernel_size=2).setup([Blob((2, 3))], [Blob()])
    # Caffe's formula: ceil((3 - 5) / 1) + 1 = -1 windows
    with pytest.raises(ShapeError, match=r"kernel 5x5 \(pad 0x0, stride 1x1, CEIL rounding\) leaves no output for "
                                         r"bottom shape \(1, 1, 3, 3\)"):
        pool_layer(kernel_size=5).setup([Blob((1, 1, 3, 3))], [Blob()])
    with pytest.raises(ShapeError, match="leaves no output"):  # floor((1 - 2) / 2) + 1 = 0
        pool_layer(kernel_size=2, stride=2, round_mode="FLOOR").setup([Blob((1, 1, 1, 1))], [Blob()])


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_a_kernel_larger_than_the_bottom_gives_caffes_shape(xp, pool):
    # OpenPose's placeholder net: a 1x1 image through 2x2/2 poolings; Caffe: ceil((1 - 2) / 2) + 1 = 1 window,
    # clipped to the one element (AVE divides by the clipped window, as Caffe's pool_size without padding)
    bottom, top = run(pool_layer(xp=xp, pool=pool, kernel_size=2, stride=2), numpy.full((1, 2, 1, 1), 3.0), xp=xp)
    assert top[0].shape == (1, 2, 1, 1)
    numpy.testing.assert_array_equal(to_numpy(top[0].data), 3.0)
    # 3x2 under a 3x3/2 kernel: rows ceil(0 / 2) + 1 = 1, columns ceil(-1 / 2) + 1 = 1
    x = numpy.arange(6.0).reshape(1, 1, 3, 2)
    _, top = run(pool_layer(xp=xp, pool=pool, kernel_size=3, stride=2), x, xp=xp)
    assert top[0].shape == (1, 1, 1, 1)
    assert to_numpy(top[0].data).item() == (5.0 if pool == "MAX" else 2.5)


def test_padding_on_one_axis_clips_both_axes_as_caffe():
    # Caffe drops a last ceil-mode window starting past the image on BOTH axes when EITHER has padding:
    # H: ceil((5 + 2 - 3) / 3) + 1 = 3, and (3 - 1) * 3 >= 5 + 1, so 2; W (pad 0): ceil((5 - 1) / 3) + 1 = 3,
    # and (3 - 1) * 3 >= 5 + 0, so 2 as well (a rule for the padded axis alone would keep 3)
    from layerforge.blob import Blob
    from layerforge.layers import create_layer

    layer = create_layer({"type": "Pooling", "pooling": {"pool": "MAX", "kernel_h": 3, "kernel_w": 1,
                                                         "stride": 3, "pad_h": 1, "pad_w": 0}})
    top = [Blob()]
    layer.setup([Blob((1, 1, 5, 5))], top)
    assert top[0].shape == (1, 1, 2, 2)
    layer = create_layer({"type": "Pooling", "pooling": {"pool": "MAX", "kernel_h": 3, "kernel_w": 1, "stride": 3}})
    layer.setup([Blob((1, 1, 5, 5))], top)
    assert top[0].shape == (1, 1, 2, 3)  # no padding anywhere: no clipping, W keeps its third window


def _stochastic(phase, **extra):
    from layerforge.layers import create_layer

    return create_layer({"type": "Pooling", "pooling": {"pool": "STOCHASTIC", "kernel_size": 2, "stride": 2,
                                                        **extra}}, phase=phase, dtype=numpy.float64)


def test_stochastic_pooling_draws_in_proportion_and_routes_the_gradient():
    from layerforge.blob import Blob
    from layerforge.kernels.pooling import stochastic_pooling_forward

    x = numpy.array([[[[1.0, 2.0], [3.0, 4.0]]]])  # one window: raster order 1, 2, 3, 4 (sum 10)
    for u, index, value in [(0.0, 0, 1.0), (0.1, 0, 1.0), (0.25, 1, 2.0), (0.5, 2, 3.0), (0.95, 3, 4.0)]:
        y, idx = stochastic_pooling_forward(x, 2, 2, 2, 2, 1, 1, numpy.full((1, 1, 1, 1), u))
        assert (float(y.reshape(-1)[0]), int(idx.reshape(-1)[0])) == (value, index)
    y, idx = stochastic_pooling_forward(x, 2, 2, 2, 2, 1, 1)  # TEST: sum(x^2) / sum(x)
    assert float(y.reshape(-1)[0]) == pytest.approx(30 / 10) and idx is None
    layer = _stochastic("TRAIN")
    bottom, top = [Blob((4000, 1, 2, 2), numpy.float64)], [Blob(dtype=numpy.float64)]
    bottom[0].data[...] = x
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    counts = numpy.array([(top[0].data == v).mean() for v in (1, 2, 3, 4)])
    numpy.testing.assert_allclose(counts, [0.1, 0.2, 0.3, 0.4], atol=0.03)
    top[0].diff[...] = 1
    layer.backward(top, [True], bottom)
    picked = bottom[0].diff.reshape(4000, 4).argmax(axis=1)
    numpy.testing.assert_array_equal(bottom[0].data.reshape(4000, 4)[numpy.arange(4000), picked],
                                     top[0].data.reshape(-1))
    assert bottom[0].diff.sum() == 4000


def test_stochastic_pooling_test_phase_and_zero_windows():
    from layerforge.blob import Blob

    layer = _stochastic("TEST")
    x = numpy.zeros((1, 1, 4, 4))
    x[0, 0, :2, :2] = [[1.0, 0.0], [0.0, 3.0]]
    bottom, top = [Blob((1, 1, 4, 4), numpy.float64)], [Blob(dtype=numpy.float64)]
    bottom[0].data[...] = x
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    numpy.testing.assert_allclose(top[0].data[0, 0], [[10 / 4, 0], [0, 0]])


def test_stochastic_pooling_refuses_padding():
    from layerforge.errors import ConfigError

    with pytest.raises(ConfigError, match="STOCHASTIC pooling takes no padding"):
        _stochastic("TRAIN", pad=1)


def test_stochastic_pooling_gradient_check():
    from layerforge.blob import Blob
    from layerforge.testing import check_gradient, make_blob

    x = numpy.random.RandomState(4).uniform(0.5, 2.0, (2, 2, 4, 5))  # positive: every element can be drawn
    check_gradient(_stochastic("TRAIN"), [make_blob(x)], [Blob()], stepsize=1e-4)


def test_stochastic_pooling_train_draws_come_from_the_seeded_stream(xp):
    from layerforge import rng

    # a 3x5 plane, kernel 2 stride 2: ceil-mode windows (2 x 3), the last row and column clipped to the image
    x = numpy.array([[1.0, 3.0, 0.0, 2.0, 5.0],
                     [2.0, 4.0, 1.0, 1.0, 5.0],
                     [0.0, 6.0, 2.0, 2.0, 8.0]]).reshape(1, 1, 3, 5)
    layer = create_layer({"type": "Pooling", "pooling": {"pool": "STOCHASTIC", "kernel_size": 2, "stride": 2}},
                         phase="TRAIN", dtype=numpy.float64, xp=xp)
    bottom, top = [make_blob(x, xp=xp)], [Blob((), numpy.float64, xp)]
    layer.setup(bottom, top)
    rng.seed(21)
    layer.forward(bottom, top)
    rng.seed(21)
    u = rng.get_rng().random((1, 1, 2, 3))
    # by hand: the first element (raster order within the window) whose running sum reaches u * window sum
    windows = [[[1, 3, 2, 4], [0, 2, 1, 1], [5, 5]], [[0, 6], [2, 2], [8]]]
    expected = [[w[numpy.searchsorted(numpy.cumsum(w), u[0, 0, r, c] * sum(w))] for c, w in enumerate(row)]
                for r, row in enumerate(windows)]
    numpy.testing.assert_array_equal(to_numpy(top[0].data)[0, 0], expected)
    top[0].diff[...] = xp.asarray(numpy.arange(1.0, 7.0).reshape(1, 1, 2, 3))
    layer.backward(top, [True], bottom)
    gx = to_numpy(bottom[0].diff)[0, 0]
    assert gx.sum() == 21 and numpy.count_nonzero(gx) == 6  # each window's gradient on one element, of its value
    for (r, c), g in numpy.ndenumerate(numpy.arange(1.0, 7.0).reshape(2, 3)):
        window = gx[2 * r:2 * r + 2, 2 * c:2 * c + 2]
        assert window.sum() == g and x[0, 0, 2 * r:2 * r + 2, 2 * c:2 * c + 2][window == g][0] == expected[r][c]
