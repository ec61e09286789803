import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

GAUSS = {"type": "GAUSSIAN", "std": 0.5}


def conv_layer(dtype=numpy.float64, xp=numpy, **param):
    param.setdefault("weight_filler", GAUSS)
    param.setdefault("bias_filler", GAUSS)
    return create_layer({"type": "Convolution", "convolution": param}, dtype=dtype, xp=xp)


def caffe_conv(x, W, b, kh, kw, sy, sx, ph, pw, dy, dx, group):
    """Caffe's caffe_conv test reference: every output element as an explicit loop."""
    n, c, h, w = x.shape
    cout = W.shape[0]
    out_h = (h + 2 * ph - (dy * (kh - 1) + 1)) // sy + 1
    out_w = (w + 2 * pw - (dx * (kw - 1) + 1)) // sx + 1
    y = numpy.zeros((n, cout, out_h, out_w))
    cin_g, cout_g = c // group, cout // group
    for img in range(n):
        for o in range(cout):
            g = o // cout_g
            for r in range(out_h):
                for s in range(out_w):
                    acc = 0.0 if b is None else b[o]
                    for ci in range(cin_g):
                        for p in range(kh):
                            for q in range(kw):
                                yy, xx = r * sy - ph + p * dy, s * sx - pw + q * dx
                                if 0 <= yy < h and 0 <= xx < w:
                                    acc += W[o, ci, p, q] * x[img, g * cin_g + ci, yy, xx]
                    y[img, o, r, s] = acc
    return y


CASES = [  # param block, bottom shape
    ({"num_output": 3, "kernel_size": 3}, (2, 2, 5, 5)),
    ({"num_output": 4, "kernel_size": 3, "stride": 2, "pad": 1}, (2, 3, 6, 5)),
    ({"num_output": 2, "kernel_size": 1}, (2, 3, 4, 4)),
    ({"num_output": 4, "kernel_size": 3, "group": 2, "pad": 1}, (1, 4, 5, 4)),
    ({"num_output": 3, "kernel_size": 3, "dilation": 2, "pad": 2}, (2, 2, 6, 6)),
    ({"num_output": 2, "kernel_h": 2, "kernel_w": 3, "stride_h": 2, "stride_w": 1, "pad_h": 1, "pad_w": 0},
     (1, 2, 5, 6)),
    ({"num_output": 3, "kernel_size": [3, 2], "dilation": [1, 2], "bias_term": False}, (2, 2, 5, 6)),
    ({"num_output": 6, "kernel_size": 2, "group": 3, "stride": [1, 2], "bias_term": False}, (1, 3, 4, 5)),
    ({"num_output": 3, "kernel_size": 3, "pad": 2}, (1, 2, 7, 5)),  # Winograd: odd sizes, tiles cut at the edge
    ({"num_output": 4, "kernel_size": 5, "pad": 2, "group": 2}, (2, 4, 7, 6)),  # F(2x2, 5x5), as AlexNet's conv2
]


def geometry(layer):
    return layer.geometry + (layer.group,)


ENGINES = ["IM2COL", "IMPLICIT", "AUTO", "WINOGRAD", "WINOGRAD_F2"]


def engine_applies(engine, param):
    """Winograd engines run stride-1 undilated layers only, WINOGRAD 3x3 ones and WINOGRAD_F2 3x3 and 5x5 ones (others
    refuse them: test_winograd.py)."""
    return not engine.startswith("WINOGRAD") or (
        param.get("kernel_size") in ((3, 5) if engine == "WINOGRAD_F2" else (3,)) and param.get("stride", 1) == 1
        and param.get("dilation", 1) == 1)


ENGINE_CASES = [(param, shape, engine) for engine in ENGINES for param, shape in CASES if engine_applies(engine, param)]


@pytest.mark.parametrize("param, shape, engine", ENGINE_CASES)
def test_forward_matches_naive_reference(xp, param, shape, engine):
    layer = conv_layer(xp=xp, engine=engine, **param)
    x = numpy.random.default_rng(0).standard_normal(shape)
    bottom, top = [Blob(shape, numpy.float64, xp)], [Blob((), numpy.float64, xp)]
    bottom[0].data[...] = xp.asarray(x)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    b = None if len(layer.blobs) == 1 else to_numpy(layer.blobs[1].data)
    expected = caffe_conv(x, to_numpy(layer.blobs[0].data), b, *geometry(layer))
    got = to_numpy(top[0].data)
    assert got.shape == expected.shape
    numpy.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("param, shape, engine", ENGINE_CASES)
def test_forward_and_gradients_match_torch(param, shape, engine):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    layer = conv_layer(engine=engine, **param)
    rng = numpy.random.default_rng(1)
    bottom, top = [make_blob(rng.standard_normal(shape))], [Blob((), numpy.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = rng.standard_normal(top[0].shape)
    layer.backward(top, [True], bottom)

    kh, kw, sy, sx, ph, pw, dy, dx, group = geometry(layer)
    x = torch.tensor(bottom[0].data, requires_grad=True)
    W = torch.tensor(layer.blobs[0].data, requires_grad=True)
    b = torch.tensor(layer.blobs[1].data, requires_grad=True) if len(layer.blobs) > 1 else None
    y = F.conv2d(x, W, b, stride=(sy, sx), padding=(ph, pw), dilation=(dy, dx), groups=group)
    (y * torch.tensor(top[0].diff)).sum().backward()
    numpy.testing.assert_allclose(top[0].data, y.detach().numpy(), rtol=1e-10, atol=1e-12)
    numpy.testing.assert_allclose(bottom[0].diff, x.grad.numpy(), rtol=1e-10, atol=1e-12)
    numpy.testing.assert_allclose(layer.blobs[0].diff, W.grad.numpy(), rtol=1e-10, atol=1e-12)
    if b is not None:
        numpy.testing.assert_allclose(layer.blobs[1].diff, b.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("param, shape, engine", [c for c in ENGINE_CASES if c[:2] in
                                                   (CASES[1], CASES[3], CASES[4], CASES[6], CASES[8], CASES[9])])
def test_gradient_check(param, shape, engine):
    layer = conv_layer(engine=engine, **param)
    bottom = [make_blob(numpy.random.default_rng(2).standard_normal(shape))]
    assert check_gradient(layer, bottom, [Blob((), numpy.float64)]) > 0


def test_hand_computed_values_and_parameter_diffs_accumulate():
    layer = conv_layer(num_output=1, kernel_size=2, stride=1,
                       weight_filler={"type": "CONSTANT", "value": 1.0}, bias_filler={"type": "CONSTANT", "value": 0.5})
    bottom, top = [make_blob(numpy.arange(9.0).reshape(1, 1, 3, 3))], [Blob((), numpy.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    numpy.testing.assert_array_equal(top[0].data[0, 0], [[8.5, 12.5], [20.5, 24.5]])
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    numpy.testing.assert_array_equal(bottom[0].diff[0, 0], [[1, 2, 1], [2, 4, 2], [1, 2, 1]])
    numpy.testing.assert_array_equal(layer.blobs[0].diff[0, 0], [[8, 12], [20, 24]])
    assert layer.blobs[1].diff.tolist() == [4.0]
    layer.backward(top, [False], bottom)  # parameter diffs add up; the bottom diff is left alone
    numpy.testing.assert_array_equal(layer.blobs[0].diff[0, 0], [[16, 24], [40, 48]])
    assert layer.blobs[1].diff.tolist() == [8.0]


def test_shapes_dtype_and_multiply_adds():
    layer = conv_layer(dtype=numpy.float32, num_output=8, kernel_size=3, pad=1, stride=2, group=2)
    bottom, top = [make_blob(numpy.ones((4, 6, 9, 7)), numpy.float32)], [Blob()]
    layer.setup(bottom, top)
    assert layer.blobs[0].shape == (8, 3, 3, 3) and layer.blobs[1].shape == (8,)
    assert top[0].shape == (4, 8, 5, 4)
    layer.forward(bottom, top)
    assert top[0].data.dtype == numpy.float32
    assert layer.multiply_adds(bottom, top) == 4 * 8 * 5 * 4 * 3 * 3 * 3


def test_several_bottoms_share_the_filters():
    rng = numpy.random.default_rng(4)
    bottom = [make_blob(rng.standard_normal((1, 2, 4, 4))) for _ in range(2)]
    top = [Blob((), numpy.float64) for _ in range(2)]
    layer = create_layer({"type": "Convolution", "bottom": ["a", "b"], "top": ["c", "d"],
                          "convolution": {"num_output": 2, "kernel_size": 3, "weight_filler": GAUSS}},
                         dtype=numpy.float64)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    single = conv_layer(num_output=2, kernel_size=3)
    t = [Blob((), numpy.float64)]
    single.setup([bottom[1]], t)
    single.blobs[0].data[...] = layer.blobs[0].data
    single.blobs[1].data[...] = layer.blobs[1].data
    single.forward([bottom[1]], t)
    numpy.testing.assert_allclose(top[1].data, t[0].data)
    assert check_gradient(layer, bottom, top) > 0


@pytest.mark.parametrize("param, message", [
    ({"kernel_size": 3}, "num_output"),
    ({"num_output": 4, "kernel_size": 3, "kernel_h": 3, "kernel_w": 3}, "not both"),
    ({"num_output": 4, "kernel_h": 3}, "kernel_w"),
    ({"num_output": 5, "kernel_size": 3, "group": 2}, "not divisible by group"),
    ({"num_output": 4, "kernel_size": 3, "engine": "CUDNN"}, "AUTO, DEFAULT, IM2COL, IMPLICIT"),
])
def test_config_errors(param, message):
    with pytest.raises(ConfigError, match=message):
        create_layer({"type": "Convolution", "convolution": param})


@pytest.mark.parametrize("param, shape, message", [
    ({"num_output": 4, "kernel_size": 3, "group": 2}, (1, 3, 5, 5), "not divisible by group 2"),
    ({"num_output": 4, "kernel_size": 7}, (1, 3, 5, 5), r"does not fit bottom shape \(1, 3, 5, 5\)"),
])
def test_shape_errors(param, shape, message):
    with pytest.raises(ShapeError, match=message):
        conv_layer(**param).setup([Blob(shape)], [Blob()])


@pytest.mark.parametrize("param, shape, error, message", [
    ({"num_output": 4, "kernel_size": [3, 3]}, (1, 3, 4, 5, 5), ConfigError, "kernel_size has 2 values for 3 spatial"),
    ({"num_output": 4}, (1, 3, 5, 5), ConfigError, "required: kernel_size, or kernel_h and kernel_w"),
    ({"num_output": 4}, (1, 3, 4, 5, 5), ConfigError, "kernel_size has 0 values for 3 spatial"),
    ({"num_output": 4, "kernel_h": 3, "kernel_w": 3}, (1, 2, 3, 5, 5), ConfigError, "kernel_h is for 2-D.*3 spatial"),
    ({"num_output": 4, "kernel_size": 1, "stride_h": 1, "stride_w": 1, "axis": 2}, (1, 2, 3, 5), ConfigError,
     "stride_h is for 2-D.*1 spatial"),
    ({"num_output": 4, "kernel_size": 1, "pad_h": 1, "pad_w": 1}, (1, 3, 4, 5, 5), ConfigError, "pad_h is for 2-D"),
    ({"num_output": 4, "kernel_size": 3, "axis": 4}, (1, 3, 5, 5), ShapeError, "axis 4 is out of range"),
    ({"num_output": 4, "kernel_size": 5}, (1, 3, 4, 5, 5), ShapeError, r"does not fit bottom shape \(1, 3, 4, 5, 5\)"),
])
def test_nd_errors_name_the_key(param, shape, error, message):
    with pytest.raises(error, match=message):
        conv_layer(**param).setup([Blob(shape)], [Blob()])


def test_channel_change_after_setup_is_a_shape_error():
    layer = conv_layer(num_output=2, kernel_size=1)
    layer.setup([Blob((1, 3, 4, 4))], [Blob()])
    with pytest.raises(ShapeError, match="expect 3"):
        layer.reshape([Blob((1, 4, 4, 4))], [Blob()])


GRID = [  # float32 shapes large enough that IMPLICIT tiles: (param, bottom shape)
    ({"num_output": 16, "kernel_size": 3, "pad": 1}, (4, 8, 14, 14)),
    ({"num_output": 16, "kernel_size": 3, "stride": 2, "pad": 1}, (4, 8, 15, 15)),
    ({"num_output": 16, "kernel_size": 1}, (4, 32, 7, 7)),
    ({"num_output": 8, "kernel_size": 1, "stride": 2}, (2, 16, 9, 9)),
    ({"num_output": 12, "kernel_size": 3, "dilation": 2, "pad": 2}, (2, 6, 11, 10)),
    ({"num_output": 12, "kernel_size": 3, "group": 3, "pad": 1}, (2, 6, 8, 8)),
    ({"num_output": 8, "kernel_size": 5, "stride": [2, 1], "pad": [1, 2]}, (2, 3, 12, 9)),
]


def run_layer(layer, x, W, gy, calls=1):
    bottom, top = [make_blob(x, numpy.float32)], [Blob()]
    layer.setup(bottom, top)
    layer.blobs[0].data[...] = W
    layer.blobs[1].data[...] = 0.5
    for _ in range(calls):
        layer.blobs[0].diff[...] = 0
        layer.blobs[1].diff[...] = 0
        layer.forward(bottom, top)
        top[0].diff[...] = gy
        layer.backward(top, [True], bottom)
    return [top[0].data.copy(), bottom[0].diff.copy(), layer.blobs[0].diff.copy(), layer.blobs[1].diff.copy()]


@pytest.mark.parametrize("param, shape", GRID)
def test_engines_agree_with_each_other_and_torch_in_float32(param, shape, monkeypatch):
    torch = pytest.importorskip("torch")
    from layerforge.kernels import implicit_gemm
    monkeypatch.setattr(implicit_gemm, "DEFAULT_BUDGET", 4096)  # several tiles, row tiles included
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal(shape).astype(numpy.float32)
    probe = conv_layer(dtype=numpy.float32, **param)
    top = [Blob()]
    probe.setup([make_blob(x, numpy.float32)], top)
    W = rng.standard_normal(probe.blobs[0].shape).astype(numpy.float32)
    gy = rng.standard_normal(top[0].shape).astype(numpy.float32)
    results = {engine: run_layer(conv_layer(dtype=numpy.float32, engine=engine, **param), x, W, gy,
                                 calls=12 if engine == "AUTO" else 1) for engine in ENGINES
               if engine_applies(engine, param)}
    kh, kw, sy, sx, ph, pw, dy, dx, group = geometry(probe)
    xt, Wt = torch.tensor(x, requires_grad=True), torch.tensor(W, requires_grad=True)
    bt = torch.full((W.shape[0],), 0.5, requires_grad=True)
    y = torch.nn.functional.conv2d(xt, Wt, bt, stride=(sy, sx), padding=(ph, pw), dilation=(dy, dx), groups=group)
    (y * torch.tensor(gy)).sum().backward()
    expected = [y.detach().numpy(), xt.grad.numpy(), Wt.grad.numpy(), bt.grad.numpy()]
    for engine, got in results.items():
        for a, e in zip(got, expected):
            numpy.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4 * float(numpy.abs(e).max()), err_msg=engine)
        for a, e in zip(got, results["IM2COL"]):
            numpy.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5 * float(numpy.abs(e).max()), err_msg=engine)


def test_auto_times_both_engines_per_direction_then_keeps_one(caplog):
    layer = conv_layer(dtype=numpy.float32, num_output=8, kernel_size=3, pad=1)
    rng = numpy.random.default_rng(6)
    x = rng.standard_normal((2, 4, 10, 10)).astype(numpy.float32)
    gy = rng.standard_normal((2, 8, 10, 10)).astype(numpy.float32)
    bottom, top = [make_blob(x, numpy.float32)], [Blob()]
    layer.setup(bottom, top)
    assert layer.engine == "AUTO"
    assert layer.engine_choice == {"forward": None, "backward": None}
    outputs = []
    with caplog.at_level("INFO", logger="layerforge"):
        for _ in range(7):  # (1 warm-up + 2 timed) x 2 candidates, then the choice
            layer.forward(bottom, top)
            outputs.append(top[0].data.copy())
            top[0].diff[...] = gy
            layer.backward(top, [True], bottom)
    choice = layer.engine_choice
    assert set(choice.values()) <= {"IM2COL", "IMPLICIT"} and None not in choice.values()
    assert set(layer.engines.tuning["forward"].names) == {"IM2COL", "IMPLICIT"}  # 4 channels: no Winograd trial
    assert sum("engine" in r.getMessage() and layer.name in r.getMessage() for r in caplog.records) == 2
    for out in outputs[1:]:  # whichever engine ran, only rounding differs
        numpy.testing.assert_allclose(out, outputs[0], rtol=1e-5, atol=1e-5)
    unused = set(layer.engines) - set(choice.values())
    assert all(layer.engines[k].workspace_bytes == 0 for k in unused)
    assert layer.workspace_bytes > 0


@pytest.mark.parametrize("engine, expected", [("DEFAULT", "AUTO"), ("IM2COL", "IM2COL"), ("IMPLICIT", "IMPLICIT")])
def test_engine_setting(engine, expected):
    layer = conv_layer(num_output=2, kernel_size=1, engine=engine)
    layer.setup([Blob((1, 3, 4, 4))], [Blob()])
    assert layer.engine == expected
    if expected != "AUTO":
        layer.forward([Blob((1, 3, 4, 4))], [Blob((1, 2, 4, 4))])
        assert layer.engine_choice["forward"] == expected


def test_auto_skips_im2col_beyond_the_workspace_limit(monkeypatch):
    from layerforge.kernels import autotune
    monkeypatch.setattr(autotune, "AUTO_WORKSPACE_LIMIT", 1000)
    layer = conv_layer(dtype=numpy.float32, num_output=4, kernel_size=3, stride=2)  # stride 2: no Winograd
    bottom, top = [make_blob(numpy.ones((2, 3, 8, 8)), numpy.float32)], [Blob()]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert layer.engine_choice == {"forward": "IMPLICIT", "backward": "IMPLICIT"}


# -- Caffe's test_convolution_layer.cpp: Test0DConvolution and TestNDAgainst2D -------------------------------

@pytest.mark.parametrize("group", [1, 3])
def test_0d_convolution_mixes_channels_at_each_position(xp, group):
    """Test0DConvolution: axis 3 of a (2, 3, 6, 4) bottom leaves no spatial axis; each position's 4... channels
    are mixed by W (3, 4 / G) plus b, y[n, d] = b[d] + sum_c W[d, c] x[n, c] (Caffe's reference loop, over
    every position here where Caffe's stops at count(3))."""
    layer = create_layer({"type": "Convolution", "convolution": {
        "num_output": 3 * group, "axis": 3, "group": group, "weight_filler": {"type": "gaussian"},
        "bias_filler": {"type": "gaussian"}}}, dtype=numpy.float64, xp=xp)
    shape = (2, 3, 6, 3 * group)
    x = numpy.random.default_rng(5).standard_normal(shape)
    bottom, top = [make_blob(x, xp=xp)], [Blob((), numpy.float64, xp)]
    layer.setup(bottom, top)
    assert top[0].shape == (2, 3, 6, 3 * group) and layer.blobs[0].shape == (3 * group, 3)
    layer.forward(bottom, top)
    W, b = to_numpy(layer.blobs[0].data), to_numpy(layer.blobs[1].data)
    expected = numpy.empty(shape[:3] + (3 * group,))
    for n in numpy.ndindex(*shape[:3]):
        for d in range(3 * group):
            g = d // 3
            expected[n + (d,)] = b[d] + sum(W[d, c] * x[n + (g * 3 + c,)] for c in range(3))
    numpy.testing.assert_allclose(to_numpy(top[0].data), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer_type", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("axis, shape", [(3, (2, 3, 6, 4)), (1, (5, 4)), (-1, (2, 3, 4))])
def test_0d_convolution_gradient_check(layer_type, axis, shape):
    """kernel_size given once is ignored with no spatial axis (Caffe's rule: once, or once per axis)."""
    layer = create_layer({"type": layer_type, "convolution": {
        "num_output": 6, "axis": axis, "group": 2, "kernel_size": 3, "weight_filler": GAUSS, "bias_filler": GAUSS}},
        dtype=numpy.float64)
    bottom = [make_blob(numpy.random.default_rng(6).standard_normal(shape))]
    top = [Blob((), numpy.float64)]
    assert check_gradient(layer, bottom, top) > 0
    assert top[0].shape == shape[:-1] + (6,)


def test_0d_deconvolution_is_the_transposed_product():
    layer = create_layer({"type": "Deconvolution", "convolution": {
        "num_output": 3, "axis": -1, "weight_filler": GAUSS, "bias_filler": GAUSS}}, dtype=numpy.float64)
    x = numpy.random.default_rng(7).standard_normal((2, 5, 4))
    bottom, top = [make_blob(x)], [Blob((), numpy.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    W, b = layer.blobs[0].data, layer.blobs[1].data
    assert W.shape == (4, 3)
    numpy.testing.assert_allclose(top[0].data, x @ W + b, rtol=1e-12)


def test_nd_against_2d_with_kernel_h_and_kernel_w():
    """TestNDAgainst2D: kernel_h 11 / kernel_w 13, group 6, on (15, 18, 22, 26): force_nd_im2col (Caffe accepts
    kernel_h/kernel_w there: the bottom has 2 spatial axes) gives the 2-D path's forward and backward."""
    param = {"num_output": 12, "bias_term": False, "group": 6, "kernel_h": 11, "kernel_w": 13,
             "weight_filler": {"type": "gaussian"}}
    rng = numpy.random.default_rng(8)
    x = rng.standard_normal((15, 18, 22, 26))
    results = []
    for force_nd in (False, True):
        layer = conv_layer(force_nd_im2col=force_nd, engine="IM2COL", **param)
        bottom, top = [make_blob(x)], [Blob((), numpy.float64)]
        layer.setup(bottom, top)
        assert layer.nd == force_nd and layer.blobs[0].shape == (12, 3, 11, 13)
        if not results:
            W, gy = layer.blobs[0].data.copy(), rng.standard_normal(top[0].shape)
        layer.blobs[0].data[...] = W
        layer.forward(bottom, top)
        top[0].diff[...] = gy
        layer.backward(top, [True], bottom)
        results.append((top[0].data.copy(), bottom[0].diff.copy(), layer.blobs[0].diff.copy()))
    for two_d, nd in zip(*results):
        numpy.testing.assert_allclose(nd, two_d, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("param", [
    {"kernel_h": 3, "kernel_w": 2, "stride_h": 2, "stride_w": 1, "pad_h": 1, "pad_w": 0},
    {"kernel_size": [3, 2], "stride": [2, 1], "pad_h": 1, "pad_w": 0},
])
def test_force_nd_takes_the_2d_forms(param):
    layer = conv_layer(num_output=2, force_nd_im2col=True, **param)
    x = numpy.random.default_rng(9).standard_normal((2, 2, 7, 6))
    bottom, top = [make_blob(x)], [Blob((), numpy.float64)]
    layer.setup(bottom, top)
    assert layer.geometry == ((3, 2), (2, 1), (1, 0), (1, 1))
    layer.forward(bottom, top)
    expected = caffe_conv(x, layer.blobs[0].data, layer.blobs[1].data, 3, 2, 2, 1, 1, 0, 1, 1, 1)
    numpy.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-12)
