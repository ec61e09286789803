"""Winograd F(2x2,3x3), F(4x4,3x3) and F(2x2,5x5): exact adjoints in float64 (against torch), their float32 rounding
against a float64 direct convolution, and where the engines apply; strided layers over space-to-depth blocks
(kernels.space_to_depth, whose own operands tests/kernels/test_space_to_depth.py checks)."""
import numpy
import pytest

from layerforge.errors import ConfigError
from layerforge.kernels import blas
from layerforge.kernels.blas import matmul
from layerforge.kernels.implicit_gemm import Im2colConv
from layerforge.kernels.winograd import WinogradConv, eligible
from layerforge.layers import create_layer

torch = pytest.importorskip("torch")

SHAPES = [  # (N, C, H, W, K, pad, groups)
    (2, 3, 7, 9, 4, 1, 1),
    (1, 4, 5, 5, 6, 0, 2),
    (3, 2, 8, 6, 2, 2, 1),
    (2, 4, 11, 10, 4, 1, 2),
    (1, 1, 3, 3, 1, 0, 1),
    (2, 2, 4, 13, 3, 3, 1),
]


# (tile m, filter size r) of every F(m x m, r x r)
FILTERS = [(2, 3), (4, 3), (2, 5)]


def geometry_of(r, pad):
    """A stride-1 r x r geometry whose output is the 3x3 one's with ``pad`` (the shapes below serve every r)."""
    pad += (r - 3) // 2
    return (r, r, 1, 1, pad, pad, 1, 1)


def run(engine, x, W, b, gy):
    y = numpy.empty(gy.shape, x.dtype)
    engine.forward(x, W, b, y)
    gW, gb, gx = numpy.zeros_like(W), numpy.zeros_like(b), numpy.empty_like(x)
    engine.backward(x, W, gy, gW, gb, gx)
    return y, gx, gW, gb


@pytest.mark.parametrize("tile,r", FILTERS)
@pytest.mark.parametrize("n,c,h,w,k,pad,groups", SHAPES)
def test_forward_and_both_gradients_equal_torch_in_float64(tile, r, n, c, h, w, k, pad, groups):
    rng = numpy.random.default_rng(0)
    x, W, b = rng.standard_normal((n, c, h, w)), rng.standard_normal((k, c // groups, r, r)), rng.standard_normal(k)
    gy = rng.standard_normal((n, k, h + 2 * pad - 2, w + 2 * pad - 2))
    geometry = geometry_of(r, pad)
    got = run(WinogradConv(geometry, groups, tile), x, W, b, gy)
    xt, Wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, W, b))
    yt = torch.nn.functional.conv2d(xt, Wt, bt, padding=geometry[4], groups=groups)
    yt.backward(torch.tensor(gy))
    for a, e in zip(got, (yt.detach(), xt.grad, Wt.grad, bt.grad)):
        numpy.testing.assert_allclose(a, e.numpy(), rtol=1e-10, atol=1e-11)


def test_gradients_accumulate_and_may_be_skipped():
    rng = numpy.random.default_rng(1)
    x, W = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
    gy = rng.standard_normal((2, 4, 6, 6))
    engine = WinogradConv((3, 3, 1, 1, 1, 1, 1, 1), 1, 4)
    gW = numpy.ones_like(W)
    engine.backward(x, W, gy, gW, None, None)
    once = numpy.zeros_like(W)
    engine.backward(x, W, gy, once, None, None)
    numpy.testing.assert_allclose(gW, once + 1, rtol=1e-12)


def float32_error(engine, n=4, c=64, h=28, k=64, seed=0):
    """max |y32 - y64| / max |y64| for He-initialised weights and unit normal data."""
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, h))
    W = rng.standard_normal((k, c, 3, 3)) * numpy.sqrt(2.0 / (9 * c))
    exact = numpy.empty((n, k, h, h))
    Im2colConv((3, 3, 1, 1, 1, 1, 1, 1), 1).forward(x, W, None, exact)
    y = numpy.empty((n, k, h, h), numpy.float32)
    engine.forward(x.astype(numpy.float32), W.astype(numpy.float32), None, y)
    return float(numpy.abs(y - exact).max() / numpy.abs(exact).max())


def test_float32_rounding_f2_as_direct_f4_within_its_documented_bound():
    geometry = (3, 3, 1, 1, 1, 1, 1, 1)
    direct = float32_error(Im2colConv(geometry, 1))
    f2 = float32_error(WinogradConv(geometry, 1, 2))
    f4 = float32_error(WinogradConv(geometry, 1, 4))
    assert direct < 2e-6
    assert f2 < 2 * direct + 1e-7  # what lets AUTO try it
    assert direct < f4 < 3e-5  # docs/performance.md: 1e-5 typical, 10-25x direct


def conv(engine, **param):
    return create_layer({"name": "c", "type": "Convolution", "bottom": ["x"], "top": ["y"],
                         "convolution": dict(num_output=2, engine=engine, **param)})


@pytest.mark.parametrize("param,what", [
    ({"kernel_size": 7}, "kernel 7x7"), ({"kernel_size": 3, "stride": 2}, "stride 2x2"),
    ({"kernel_size": 5, "dilation": 2}, "dilation 2x2"), ({"kernel_size": [5, 3]}, "kernel 5x3"),
    ({"kernel_size": [3, 3, 3]}, "2-D convolutions only")])
@pytest.mark.parametrize("engine,runs", [("WINOGRAD", "whose kernel spans 3x3 strides"),
                                         ("WINOGRAD_F2", "whose kernel spans 3x3 or 5x5 strides")])
def test_ineligible_layers_refuse_winograd_in_one_line(engine, runs, param, what):
    with pytest.raises(ConfigError) as e:
        conv(engine, **param)
    text = str(e.value)
    assert "convolution.engine" in text and what in text and "layer 'c'" in text and "\n" not in text
    assert runs in text or what == "2-D convolutions only"


def test_f4_refuses_a_5x5_layer_that_f2_runs():
    with pytest.raises(ConfigError, match=r"engine WINOGRAD runs .* spans 3x3 strides .* kernel 5x5"):
        conv("WINOGRAD", kernel_size=5)
    from layerforge.blob import Blob
    layer = conv("WINOGRAD_F2", kernel_size=5, pad=2)
    layer.setup([Blob((2, 4, 8, 8))], [Blob()])
    assert layer.engine_choice == {"forward": "WINOGRAD_F2", "backward": "WINOGRAD_F2"}
    assert layer.engines["WINOGRAD_F2"].r == 5  # F(2x2, 5x5)


@pytest.mark.parametrize("param,channels,tried", [
    ({"kernel_size": 3, "pad": 1}, 64, {"IM2COL", "IMPLICIT", "WINOGRAD_F2", "WINOGRAD"}),
    ({"kernel_size": 3, "pad": 1}, 512, {"IM2COL", "IMPLICIT", "WINOGRAD_F2", "WINOGRAD"}),
    ({"kernel_size": 3, "pad": 1}, 513, {"IM2COL", "IMPLICIT", "WINOGRAD_F2"}),  # F4's error untested beyond 512
    ({"kernel_size": 3, "pad": 1, "group": 2}, 1024, {"IM2COL", "IMPLICIT", "WINOGRAD_F2", "WINOGRAD"}),  # 512 each
    ({"kernel_size": 3, "pad": 1}, 63, {"IM2COL", "IMPLICIT"}),  # few channels: the transforms dominate
    ({"kernel_size": 3, "pad": 1, "group": 2}, 64, {"IM2COL", "IMPLICIT"}),  # 32 per group
    ({"kernel_size": 3, "stride": 2}, 64, {"IM2COL", "IMPLICIT"}),
    ({"kernel_size": 1}, 64, {"IM2COL", "IMPLICIT"}),
    ({"kernel_size": 5, "pad": 2}, 16, {"IM2COL", "IMPLICIT", "WINOGRAD_F2"}),  # F(2,5), from 16 channels
    ({"kernel_size": 5, "pad": 2, "group": 2}, 96, {"IM2COL", "IMPLICIT", "WINOGRAD_F2"}),  # AlexNet's conv2
    ({"kernel_size": 5, "pad": 2}, 15, {"IM2COL", "IMPLICIT"}),
    ({"kernel_size": 5, "pad": 2}, 512, {"IM2COL", "IMPLICIT", "WINOGRAD_F2"}),
    ({"kernel_size": 5, "pad": 2}, 513, {"IM2COL", "IMPLICIT"}),  # F(2,5)'s error untested beyond 512
    # strided: over space-to-depth blocks of C s^2 channels, a kernel spanning 3x3 (or 5x5) strides, from 16 channels
    ({"kernel_size": 11, "stride": 4}, 3, {"IM2COL", "IMPLICIT", "WINOGRAD_F2", "WINOGRAD"}),  # AlexNet's conv1: 48
    ({"kernel_size": 11, "stride": 4}, 1, {"IM2COL", "IMPLICIT", "WINOGRAD_F2", "WINOGRAD"}),  # 16
    ({"kernel_size": 5, "stride": 2}, 3, {"IM2COL", "IMPLICIT"}),  # 12
    ({"kernel_size": 5, "stride": 2}, 64, {"IM2COL", "IMPLICIT", "WINOGRAD_F2", "WINOGRAD"}),  # 256
    ({"kernel_size": 5, "stride": 2}, 129, {"IM2COL", "IMPLICIT", "WINOGRAD_F2"}),  # 516: F4's error untested
    ({"kernel_size": 9, "stride": 2}, 16, {"IM2COL", "IMPLICIT", "WINOGRAD_F2"}),  # 5x5 strides: F(2,5)
    ({"kernel_size": 7, "stride": 2}, 64, {"IM2COL", "IMPLICIT"}),  # ResNet's conv1: 4x4 strides
])
def test_auto_tries_winograd_only_where_it_applies(param, channels, tried):
    from layerforge.blob import Blob
    layer = conv("AUTO", **param)
    layer.setup([Blob((2, channels, 12, 12))], [Blob()])
    assert set(layer.engines.tuning["forward"].names) == tried
    spans = -(-param["kernel_size"] // param.get("stride", 1))
    assert eligible(layer.geometry, 4) == (spans == 3)
    assert eligible(layer.geometry, 2) == (spans in (3, 5))


@pytest.mark.parametrize("engine,r,stride", [("WINOGRAD", 3, 1), ("WINOGRAD_F2", 3, 1), ("WINOGRAD_F2", 5, 1),
                                             ("WINOGRAD", 6, 2), ("WINOGRAD_F2", 11, 4)])  # strided: over blocks
def test_deconvolution_runs_on_winograd(engine, r, stride):
    from layerforge.blob import Blob
    from layerforge.testing import make_blob
    layer = create_layer({"name": "d", "type": "Deconvolution", "bottom": ["x"], "top": ["y"],
                          "convolution": {"num_output": 3, "kernel_size": r, "pad": 1, "stride": stride,
                                          "engine": engine, "bias_term": False}}, dtype=numpy.float64)
    x = numpy.random.default_rng(3).standard_normal((2, 4, 5, 6))
    bottom, top = [make_blob(x)], [Blob((), numpy.float64)]
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    assert layer.engine_choice["forward"] == engine
    want = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(layer.blobs[0].data), padding=1,
                                                stride=stride)
    numpy.testing.assert_allclose(top[0].data, want.numpy(), rtol=1e-10, atol=1e-11)


def test_auto_skips_winograd_whose_tiles_for_one_image_exceed_the_workspace_limit(monkeypatch):
    """The limit holds for one image's tiles: a larger batch runs in chunks (winograd.CHUNK_BYTES), so the engines
    AUTO tries do not depend on the batch."""
    from layerforge.blob import Blob
    from layerforge.kernels.winograd import workspace_estimate
    from layerforge.kernels import autotune
    x_shape = (2, 64, 8, 8)
    assert workspace_estimate(x_shape, 2, (3, 3, 1, 1, 1, 1, 1, 1), 2, 4) == 16 * 2 * 16 * (3 * 64 + 2 * 2) * 4
    # the CPU layer runs F(2,3)'s compiled transforms: one transformed array per side
    needed = workspace_estimate((1, 64, 8, 8), 2, (3, 3, 1, 1, 1, 1, 1, 1), 2, 4, compiled=True)  # float32
    assert needed == 16 * 16 * (64 + 2) * 4  # 4x4 tiles of 2x2 outputs, 16 per image
    # F(4,3): 6x6 tiles of 4x4 outputs, 4 per image, 0.56x F2's bytes
    needed_f4 = workspace_estimate((1, 64, 8, 8), 2, (3, 3, 1, 1, 1, 1, 1, 1), 4, 4, compiled=True)
    assert needed_f4 == 36 * 4 * (64 + 2) * 4
    for limit, tried in ((needed, {"WINOGRAD_F2", "WINOGRAD"}), (needed - 1, {"WINOGRAD"}),
                         (needed_f4, {"WINOGRAD"}), (needed_f4 - 1, set())):  # (IM2COL's columns exceed all four)
        monkeypatch.setattr(autotune, "AUTO_WORKSPACE_LIMIT", limit)
        for batch in (2, 50):
            layer = conv("AUTO", kernel_size=3, pad=1)
            layer.setup([Blob((batch,) + x_shape[1:])], [Blob()])
            assert set(layer.engines.tuning["forward"].names) == {"IMPLICIT"} | tried


# F(4,3)'s and F(2,5)'s compiled CPU transforms (kernels/winograd.py's six-point, _f4_* and _f25_* bodies): odd sizes
# and partial tiles, pad 0 and 1 (2 and 3 for 5x5: geometry_of), groups, batch 1; (N, C, H, W, K, pad, groups)
COMPILED_SHAPES = [
    (2, 3, 7, 9, 4, 1, 1),
    (1, 4, 5, 5, 6, 0, 2),
    (2, 6, 9, 6, 3, 1, 3),
    (3, 2, 10, 11, 2, 0, 1),
    (1, 8, 6, 6, 8, 1, 4),
    (2, 5, 13, 3, 4, 1, 1),
    (1, 3, 3, 4, 2, 0, 1),
]


def random_problem(n, c, h, w, k, pad, groups, dtype=numpy.float64, seed=0, r=3):
    """x, W, b and gy of an r x r layer with the output of a 3x3 one with ``pad`` (geometry_of)."""
    rng = numpy.random.default_rng(seed)
    x, W, b = rng.standard_normal((n, c, h, w)), rng.standard_normal((k, c // groups, r, r)), rng.standard_normal(k)
    gy = rng.standard_normal((n, k, h + 2 * pad - 2, w + 2 * pad - 2))
    return tuple(a.astype(dtype) for a in (x, W, b, gy))


@pytest.mark.parametrize("tile,r", FILTERS)
@pytest.mark.parametrize("n,c,h,w,k,pad,groups", COMPILED_SHAPES)
def test_compiled_transforms_equal_the_xp_path(monkeypatch, tile, r, n, c, h, w, k, pad, groups):
    from layerforge.kernels import winograd
    x, W, b, gy = random_problem(n, c, h, w, k, pad, groups, r=r)
    geometry = geometry_of(r, pad)
    engine = WinogradConv(geometry, groups, tile)
    calls = []
    for name, body in winograd._COMPILED[tile, r].items():
        monkeypatch.setitem(winograd._COMPILED[tile, r], name,
                            lambda *a, body=body, name=name: calls.append(name) or body(*a))
    compiled = run(engine, x, W, b, gy)
    # forward: the filters, the input and output tiles; backward: the gradient tiles, gW's input tiles and filter
    # gradient, gx's filters (made again) and scatter
    assert sorted(calls) == sorted(["filter", "input", "output", "gradient", "input", "filter_gradient", "filter",
                                    "scatter"])
    monkeypatch.setattr(WinogradConv, "_compiled", lambda self, xp: False)
    strided = run(WinogradConv(geometry, groups, tile), x, W, b, gy)
    for a, e in zip(compiled, strided):
        numpy.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tile,r", FILTERS[1:])
@pytest.mark.parametrize("n,c,h,w,k,pad,groups", COMPILED_SHAPES)
def test_compiled_six_point_float32_equals_torch(tile, r, n, c, h, w, k, pad, groups):
    x, W, b, gy = random_problem(n, c, h, w, k, pad, groups, numpy.float32, seed=1, r=r)
    geometry = geometry_of(r, pad)
    got = run(WinogradConv(geometry, groups, tile), x, W, b, gy)
    assert all(a.dtype == numpy.float32 for a in got)
    xt, Wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, W, b))
    yt = torch.nn.functional.conv2d(xt, Wt, bt, padding=geometry[4], groups=groups)
    yt.backward(torch.tensor(gy))
    for a, e in zip(got, (yt.detach(), xt.grad, Wt.grad, bt.grad)):
        e = e.numpy()
        numpy.testing.assert_allclose(a, e, rtol=0, atol=2e-5 * max(1.0, numpy.abs(e).max()))


@pytest.mark.parametrize("engine,r", [("WINOGRAD", 3), ("WINOGRAD_F2", 5)])
@pytest.mark.parametrize("n,c,h,w,k,pad,groups", COMPILED_SHAPES[:5])
def test_compiled_six_point_finite_differences(engine, r, n, c, h, w, k, pad, groups):
    from layerforge.blob import Blob
    from layerforge.testing import check_gradient, make_blob
    layer = create_layer({"name": "c", "type": "Convolution", "bottom": ["x"], "top": ["y"],
                          "convolution": {"num_output": k, "kernel_size": r, "pad": geometry_of(r, pad)[4],
                                          "group": groups, "engine": engine,
                                          "weight_filler": {"type": "gaussian", "std": 0.5},
                                          "bias_filler": {"type": "gaussian", "std": 0.5}}}, dtype=numpy.float64)
    x = numpy.random.default_rng(2).standard_normal((n, c, h, w))
    assert check_gradient(layer, [make_blob(x)], [Blob((), numpy.float64)], stepsize=1e-4, threshold=1e-6) > 0


@pytest.mark.parametrize("tile,r", FILTERS)
def test_each_backend_equals_torch(xp, tile, r):
    """The compiled transforms on numpy, the xp path on cupy (a real device or the emulated one)."""
    from layerforge.backend import to_numpy
    x, W, b, gy = random_problem(2, 6, 9, 7, 4, 1, 2, r=r)
    geometry = geometry_of(r, 1)
    engine = WinogradConv(geometry, 2, tile)
    y = xp.empty(gy.shape)
    engine.forward(xp.asarray(x), xp.asarray(W), xp.asarray(b), y)
    gW, gb, gx = xp.zeros(W.shape), xp.zeros(b.shape), xp.empty(x.shape)
    engine.backward(xp.asarray(x), xp.asarray(W), xp.asarray(gy), gW, gb, gx)
    xt, Wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, W, b))
    yt = torch.nn.functional.conv2d(xt, Wt, bt, padding=geometry[4], groups=2)
    yt.backward(torch.tensor(gy))
    for a, e in zip((y, gx, gW, gb), (yt.detach(), xt.grad, Wt.grad, bt.grad)):
        numpy.testing.assert_allclose(to_numpy(a), e.numpy(), rtol=1e-10, atol=1e-11)


def float32_errors(c, size, n=1, seed=0, k=None, group=1, tile=4, r=3):
    """{engine: max |a32 - a64| / max |a64| of (y, gx, gW)} for IM2COL and compiled WINOGRAD F(tile, r) against
    IM2COL in float64: ``c`` input and ``k`` (default ``c``) output channels per group, unit normal data and output
    gradient, He-initialised weights, the output the input's size (bench_winograd.py --error)."""
    geometry = geometry_of(r, 1)
    k = k or c
    rng = numpy.random.default_rng(seed)
    x, gy = rng.standard_normal((n, c * group, size, size)), rng.standard_normal((n, k * group, size, size))
    W, b = rng.standard_normal((k * group, c, r, r)) * numpy.sqrt(2.0 / (r * r * c)), numpy.zeros(k * group)
    exact = run(Im2colConv(geometry, group), x, W, b, gy)[:3]
    out = {}
    for name, engine in (("IM2COL", Im2colConv(geometry, group)), ("WINOGRAD", WinogradConv(geometry, group, tile))):
        got = run(engine, *(a.astype(numpy.float32) for a in (x, W, b, gy)))[:3]
        out[name] = [float(numpy.abs(a - e).max() / numpy.abs(e).max()) for a, e in zip(got, exact)]
    return out


# The 3x3 stride-1 shapes of the zoo nets where AUTO tries F(4,3) (64 to 512 input channels per group: every one
# but VGG-16's first, 3 channels): (input channels per group, output channels per group, groups, size). Measured at
# batch 1 (2026-11-28): F4's float32 error of y, gx and gW 2.8e-6 to 1.4e-5 (8-30x IM2COL's 2e-7 to 7e-7); the bound,
# F4_BOUND, leaves 2x. VGG-16's 64 x 224 layer (9.7e-6) is left out for its time (IM2COL in float64: 35 s here).
ZOO_3X3 = [
    (64, 64, 1, 56), (128, 128, 1, 28), (256, 256, 1, 14), (512, 512, 1, 7),  # ResNet-50, -101, -152
    (64, 192, 1, 56), (96, 128, 1, 28), (96, 208, 1, 14), (160, 320, 1, 7),  # GoogLeNet (and the others alike)
    (192, 192, 2, 13), (256, 384, 1, 13),  # AlexNet conv4 (conv5 alike), conv3
    pytest.param(128, 128, 1, 112, marks=pytest.mark.slow),  # VGG-16 conv2_2 (conv2_1 alike)
    pytest.param(256, 256, 1, 56, marks=pytest.mark.slow),  # VGG-16 conv3_2 (conv3_1 alike)
    pytest.param(512, 512, 1, 28, marks=pytest.mark.slow), (512, 512, 1, 14),  # VGG-16 conv4, conv5
]
F4_BOUND = 3e-5


@pytest.mark.parametrize("c,k,group,size", ZOO_3X3)
def test_compiled_f4_float32_error_per_zoo_shape(c, k, group, size):
    """AUTO tries F(4,3) on these layers (autotune.AUTO_WINOGRAD_F4_MAX_CHANNELS): its error stays within the
    bound; IM2COL's, 20x smaller, is what AUTO's other engines round like."""
    from layerforge.kernels.autotune import AUTO_WINOGRAD_F4_MAX_CHANNELS, AUTO_WINOGRAD_MIN_CHANNELS
    assert AUTO_WINOGRAD_MIN_CHANNELS[3] <= c <= AUTO_WINOGRAD_F4_MAX_CHANNELS
    errors = float32_errors(c, size, k=k, group=group)
    assert max(errors["IM2COL"]) < 1.5e-6
    assert all(e < F4_BOUND for e in errors["WINOGRAD"]), errors
    assert errors["WINOGRAD"][0] > 4 * errors["IM2COL"][0]  # F4's own rounding, not the test's


# The 5x5 stride-1 shapes of the zoo nets, where AUTO tries F(2,5) (16 to 512 input channels per group): AlexNet's
# (and CaffeNet's) conv2, GoogLeNet's inception 5x5 layers, and wider ones up to AUTO's 512 channels. Measured at
# batch 1 (2026-11-29): F(2,5)'s float32 error of y, gx and gW 2.2e-6 to 1.2e-5 (4-25x IM2COL's 2e-7 to 7e-7), within
# F(4,3)'s bound (the same input transform; G's entries up to 2/3).
ZOO_5X5 = [
    (48, 128, 2, 27),  # AlexNet conv2
    (16, 32, 1, 28), (32, 96, 1, 28), (16, 48, 1, 14), (32, 128, 1, 14), (48, 128, 1, 7),  # GoogLeNet
    (128, 128, 1, 14), (256, 256, 1, 14), (512, 512, 1, 7),
]


@pytest.mark.parametrize("c,k,group,size", ZOO_5X5)
def test_compiled_f25_float32_error_per_zoo_shape(c, k, group, size):
    from layerforge.kernels.autotune import AUTO_WINOGRAD_F4_MAX_CHANNELS, AUTO_WINOGRAD_MIN_CHANNELS
    assert AUTO_WINOGRAD_MIN_CHANNELS[5] <= c <= AUTO_WINOGRAD_F4_MAX_CHANNELS
    errors = float32_errors(c, size, k=k, group=group, tile=2, r=5)
    assert max(errors["IM2COL"]) < 1.5e-6
    assert all(e < F4_BOUND for e in errors["WINOGRAD"]), errors
    assert errors["WINOGRAD"][0] > 3 * errors["IM2COL"][0]  # F(2,5)'s own rounding


@pytest.mark.skipif(not blas.canonical_blas(), reason="another BLAS than OpenBLAS's SkylakeX core may sum an element "
                    "by its place in the product, so by the split")
@pytest.mark.parametrize("tile,r", FILTERS)
def test_products_split_over_kernel_threads_give_the_same_bits(monkeypatch, tile, r):
    """With several kernel threads the tile positions' products are split over them, one BLAS thread each
    (winograd._position_products); the batched product on 2 BLAS threads gives the same bits. Without batch
    invariance: under it the positions are one stacked product that blas.matmul splits (test_batch_invariance.py)."""
    from threadpoolctl import threadpool_limits
    from layerforge.kernels import blas, threadpool
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", False)
    monkeypatch.setattr(threadpool, "MIN_PARALLEL_ELEMENTS", 0)
    from layerforge.kernels import winograd
    products = []  # the operands' dimensions of each product: 4 batched, 2 one position
    monkeypatch.setattr(winograd, "matmul", lambda a, b, out: products.append(a.ndim) or matmul(a, b, out=out))
    x, W, b, gy = random_problem(4, 64, 20, 19, 48, 1, 1, numpy.float32, seed=3, r=r)
    results = []
    try:
        for n in (1, 2, 3):
            threadpool.set_num_threads(n)
            with threadpool_limits(2, "blas"):
                results.append(run(WinogradConv(geometry_of(r, 1), 1, tile), x, W, b, gy))
    finally:
        threadpool.set_num_threads(None)
    positions = (tile + r - 1) ** 2
    assert products == [4] * 3 + [2] * (3 * positions) * 2  # forward, gW, gx: batched on 1 thread, then split
    for got in results[1:]:
        for a, e in zip(got, results[0]):
            assert a.tobytes() == e.tobytes()


@pytest.mark.parametrize("tile,r", FILTERS)
@pytest.mark.parametrize("per_chunk", [1, 2])
def test_a_batch_beyond_the_chunk_bytes_runs_in_chunks_of_images(monkeypatch, xp, tile, r, per_chunk):
    """A batch whose tiles exceed winograd.CHUNK_BYTES runs in chunks of ``per_chunk`` images: y and gx as the
    whole batch's (an image's tiles are its own), gW and gb the same sums to float64 rounding."""
    from layerforge.backend import to_numpy
    from layerforge.kernels import winograd
    x, W, b, gy = random_problem(5, 6, 9, 7, 4, 1, 2, r=r)
    geometry = geometry_of(r, 1)
    one = winograd.workspace_estimate((1, 6, 9, 7), 4, geometry, tile, 8, compiled=xp is numpy)

    def computed():
        engine = WinogradConv(geometry, 2, tile)
        y, gW, gb, gx = xp.empty(gy.shape), xp.zeros(W.shape), xp.zeros(b.shape), xp.empty(x.shape)
        engine.forward(xp.asarray(x), xp.asarray(W), xp.asarray(b), y)
        engine.backward(xp.asarray(x), xp.asarray(W), xp.asarray(gy), gW, gb, gx)
        return [to_numpy(a) for a in (y, gx, gW, gb)], engine._chunks(x, 4, xp is numpy)
    whole, calls = computed()
    assert calls == [(0, 5)]
    monkeypatch.setattr(winograd, "CHUNK_BYTES", per_chunk * one)
    chunked, calls = computed()
    assert calls == [(lo, min(5, lo + per_chunk)) for lo in range(0, 5, per_chunk)]
    for a, e in zip(chunked, whole):
        numpy.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tile,r", FILTERS)
@pytest.mark.parametrize("c, size, k", [(64, 14, 64), (128, 7, 64), (64, 9, 64), (512, 7, 512)])
def test_an_images_result_is_the_same_in_any_batch_and_chunk_under_the_switch(monkeypatch, threads, tile, r, c,
                                                                               size, k):
    """With the batch-invariance switch (this machine's BLAS, or thin_gemm where it is not OpenBLAS's SkylakeX core),
    an image's y and gx are the same bits alone, at any place in a batch and in any chunk of it: every tile position's
    product gives a column the same bits whatever the other columns (AUTO may then choose Winograd under the
    switch, autotune.candidate_engines). 512 channels: sums of 512 terms, which OpenBLAS cuts into blocks one way on
    one thread and another on several (thin_gemm.k_blocks). On one kernel thread the tile positions' products are one
    batched product on the BLAS threads; on two, split over the kernel threads on one BLAS thread each."""
    from layerforge.kernels import blas, threadpool, winograd
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", True)
    monkeypatch.setattr(threadpool, "MIN_PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(threadpool, "_state", dict(threadpool._state))  # the thread count restored after the test
    threadpool.set_num_threads(threads)
    x, W, b, gy = random_problem(6, c, size, size, k, 1, 1, numpy.float32, seed=4, r=r)
    geometry = geometry_of(r, 1)
    whole = run(WinogradConv(geometry, 1, tile), x, W, b, gy)
    for lo, hi in [(0, 1), (5, 6), (2, 5)]:
        part = run(WinogradConv(geometry, 1, tile), x[lo:hi], W, b, gy[lo:hi])
        for a, e, name in zip(part[:2], whole[:2], ("y", "gx")):
            assert a.tobytes() == e[lo:hi].tobytes(), name
    monkeypatch.setattr(winograd, "CHUNK_BYTES", 2 * winograd.workspace_estimate(
        (1, c, size, size), k, geometry, tile, 4, compiled=True))
    chunked = run(WinogradConv(geometry, 1, tile), x, W, b, gy)
    for a, e in zip(chunked[:2], whole[:2]):
        assert a.tobytes() == e.tobytes()


# Strided layers, run as the stride-1 convolution of their space-to-depth blocks: (N, C, H, W, K, geometry, groups).
# AlexNet's conv1 geometry, with and without padding, and a size whose last rows and columns no output reads (30:
# 11 x 11 at stride 4 reads rows 0-27); 5 x 5 and 6 x 6 at stride 2 (zero taps in the blocks' filters), 9 x 9 at
# stride 2 (5 x 5 strides: F(2,5)), unequal kernels and strides spanning 3 x 3 strides, groups.
STRIDED = [
    (2, 3, 27, 27, 4, (11, 11, 4, 4, 0, 0, 1, 1), 1),
    (2, 3, 30, 29, 4, (11, 11, 4, 4, 0, 0, 1, 1), 1),
    (1, 3, 30, 29, 4, (11, 11, 4, 4, 2, 1, 1, 1), 1),
    (1, 4, 13, 12, 6, (5, 5, 2, 2, 2, 2, 1, 1), 2),
    (2, 2, 9, 11, 3, (6, 6, 2, 2, 1, 0, 1, 1), 1),
    (1, 2, 17, 15, 2, (9, 9, 2, 2, 4, 4, 1, 1), 1),
    (1, 2, 12, 14, 2, (7, 8, 3, 3, 1, 2, 1, 1), 1),
    (2, 2, 10, 10, 2, (5, 3, 2, 1, 1, 1, 1, 1), 1),
]


def strided_problem(n, c, h, w, k, geometry, groups, dtype=numpy.float64, seed=0):
    """x, W, b and gy of a strided layer, and torch's y and (gx, gW, gb) for them."""
    kh, kw, sy, sx, ph, pw = geometry[:6]
    rng = numpy.random.default_rng(seed)
    x, W, b = rng.standard_normal((n, c, h, w)), rng.standard_normal((k, c // groups, kh, kw)), rng.standard_normal(k)
    x, W, b = (a.astype(dtype) for a in (x, W, b))
    xt, Wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, W, b))
    yt = torch.nn.functional.conv2d(xt, Wt, bt, stride=(sy, sx), padding=(ph, pw), groups=groups)
    gy = rng.standard_normal(tuple(yt.shape)).astype(dtype)
    yt.backward(torch.tensor(gy))
    return (x, W, b, gy), [t.detach().numpy() for t in (yt, xt.grad, Wt.grad, bt.grad)]


@pytest.mark.parametrize("tile,n,c,h,w,k,geometry,groups", [(tile,) + case for case in STRIDED for tile in (2, 4)
                                                             if eligible(case[5], tile)])
def test_strided_layers_equal_torch_in_float64_on_each_backend(xp, tile, n, c, h, w, k, geometry, groups):
    """y, gx (every pixel: those no output reads get zero), gW and gb, on the compiled CPU transforms and on the xp
    path of cupy (a real device or the emulated one)."""
    from layerforge.backend import to_numpy
    (x, W, b, gy), want = strided_problem(n, c, h, w, k, geometry, groups)
    engine = WinogradConv(geometry, groups, tile)
    assert engine.depth is not None and engine.tile_geometry[2:6] == (1, 1, 0, 0)
    y = xp.empty(gy.shape)
    engine.forward(xp.asarray(x), xp.asarray(W), xp.asarray(b), y)
    gW, gb, gx = xp.full(W.shape, 1.0), xp.zeros(b.shape), xp.full(x.shape, 7.0)
    engine.backward(xp.asarray(x), xp.asarray(W), xp.asarray(gy), gW, gb, gx)
    want[2] = want[2] + 1.0  # gW accumulates
    for a, e, name in zip((y, gx, gW, gb), want, ("y", "gx", "gW", "gb")):
        numpy.testing.assert_allclose(to_numpy(a), e, rtol=1e-10, atol=1e-11, err_msg=name)


@pytest.mark.parametrize("engine", ["WINOGRAD", "WINOGRAD_F2"])
@pytest.mark.parametrize("n,c,h,w,k,geometry,groups", [STRIDED[1], STRIDED[3]])
def test_strided_layer_finite_differences(engine, n, c, h, w, k, geometry, groups):
    from layerforge.blob import Blob
    from layerforge.testing import check_gradient, make_blob
    kh, kw, sy, sx, ph, pw = geometry[:6]
    layer = create_layer({"name": "c", "type": "Convolution", "bottom": ["x"], "top": ["y"],
                          "convolution": {"num_output": k, "kernel_h": kh, "kernel_w": kw, "stride_h": sy,
                                          "stride_w": sx, "pad_h": ph, "pad_w": pw, "group": groups, "engine": engine,
                                          "weight_filler": {"type": "gaussian", "std": 0.5},
                                          "bias_filler": {"type": "gaussian", "std": 0.5}}}, dtype=numpy.float64)
    x = numpy.random.default_rng(2).standard_normal((n, c, h, w))
    assert check_gradient(layer, [make_blob(x)], [Blob((), numpy.float64)], stepsize=1e-4, threshold=1e-6) > 0
    assert layer.engine_choice == {"forward": engine, "backward": engine}


@pytest.mark.parametrize("tile,bound", [(4, F4_BOUND), (2, 2e-6)])
def test_alexnet_conv1_float32_error_over_blocks(tile, bound):
    """AlexNet's conv1 (3 -> 96 channels, 11 x 11 at stride 4, 227 x 227) over its 48 block channels, batch 1:
    measured (2026-11-29) F(4,3)'s float32 error of y, gx and gW 3.8e-6 to 8.0e-6 (IM2COL's 2.6e-7 to 6.3e-7), F(2,3)'s
    2.7e-7 to 6.9e-7, as IM2COL's; F(4,3) within the zoo's bound."""
    geometry = (11, 11, 4, 4, 0, 0, 1, 1)
    rng = numpy.random.default_rng(5)
    x, gy = rng.standard_normal((1, 3, 227, 227)), rng.standard_normal((1, 96, 55, 55))
    W, b = rng.standard_normal((96, 3, 11, 11)) * numpy.sqrt(2.0 / 363), numpy.zeros(96)
    exact = run(Im2colConv(geometry, 1), x, W, b, gy)
    errors = {}
    for name, engine in (("IM2COL", Im2colConv(geometry, 1)), ("WINOGRAD", WinogradConv(geometry, 1, tile))):
        got = run(engine, *(a.astype(numpy.float32) for a in (x, W, b, gy)))
        errors[name] = [float(numpy.abs(a - e).max() / numpy.abs(e).max()) for a, e in zip(got, exact) if a.size > 96]
    assert max(errors["IM2COL"]) < 1e-6
    assert all(e < bound for e in errors["WINOGRAD"]), errors
    if tile == 4:
        assert errors["WINOGRAD"][0] > 4 * errors["IM2COL"][0]  # F(4,3)'s own rounding


@pytest.mark.parametrize("tile", [2, 4])
def test_a_strided_images_result_is_the_same_in_any_batch_under_the_switch(monkeypatch, tile):
    """The blocks are made per image, so an image's y and gx keep their bits in any batch (as stride 1's)."""
    from layerforge.kernels import blas
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", True)
    geometry = (11, 11, 4, 4, 0, 0, 1, 1)
    (x, W, b, gy), _ = strided_problem(5, 3, 47, 47, 16, geometry, 1, numpy.float32, seed=6)
    whole = run(WinogradConv(geometry, 1, tile), x, W, b, gy)
    for lo, hi in [(0, 1), (4, 5), (1, 4)]:
        part = run(WinogradConv(geometry, 1, tile), x[lo:hi], W, b, gy[lo:hi])
        for a, e, name in zip(part[:2], whole[:2], ("y", "gx")):
            assert a.tobytes() == e[lo:hi].tobytes(), name


@pytest.mark.parametrize("tile,r,geometry", [(2, 3, geometry_of(3, 1)), (4, 3, geometry_of(3, 1)),
                                             (2, 5, geometry_of(5, 1)), (4, 3, (11, 11, 4, 4, 2, 2, 1, 1))])
@pytest.mark.parametrize("chunks", [1, 2])
def test_tiles_kept_from_forward_give_backward_the_same_bits(monkeypatch, xp, tile, r, geometry, chunks):
    """forward(keep=True) holds the transformed input tiles and filters for the backward of the same x and W, which
    then does not transform them again: the same bits as transforming them (on each backend, strided layers over
    their blocks too). A batch of more than one chunk keeps nothing; a backward of another x or W transforms it."""
    from layerforge.backend import to_numpy
    from layerforge.kernels import winograd
    n, c, h, w, k, groups = (3, 6, 9, 7, 4, 2) if geometry[2] == 1 else (2, 3, 27, 27, 4, 1)
    x, W, b, gy = random_problem(n, c, h, w, k, geometry[4] - (r - 3) // 2, groups, r=r) if geometry[2] == 1 else \
        strided_problem(n, c, h, w, k, geometry, groups)[0]
    other, other_W = x[::-1].copy(), W * 0.5
    if chunks > 1:
        shape = (1,) + x.shape[1:]
        monkeypatch.setattr(winograd, "CHUNK_BYTES", winograd.workspace_estimate(
            shape, k, geometry, tile, 8, compiled=xp is numpy) * (n - 1))
    x, W, b, gy, other, other_W = (xp.asarray(a) for a in (x, W, b, gy, other, other_W))

    def passes(keep, backward_x, backward_W):
        engine = WinogradConv(geometry, groups, tile)
        results = []
        for _ in range(2):  # the second pass reuses the engine's array for the tiles
            y, gW, gb, gx = xp.empty(gy.shape), xp.zeros(W.shape), xp.zeros(b.shape), xp.empty(x.shape)
            engine.forward(x, W, b, y, keep=keep)
            kept = keep and chunks == 1
            assert (engine.kept is not None) == kept
            engine.backward(backward_x, backward_W, gy, gW, gb, gx)
            assert engine.kept is None
            # on the host, the seconds spent transforming again what a kept forward hands backward (autotune weighs
            # a backward after its own forward by them): none where it was handed them, none with chunks (a forward
            # keeps nothing there), some otherwise
            rederived = engine.rederived_seconds
            if xp is not numpy:
                assert rederived is None
            elif kept and backward_x is x and backward_W is W or chunks > 1:
                assert rederived == 0.0
            else:
                assert rederived > 0.0
            results.append([to_numpy(a) for a in (y, gW, gb, gx)])
        return results
    for backward_x, backward_W in ((x, W), (other, W), (x, other_W)):  # other arrays: transformed again
        for want, got in zip(passes(False, backward_x, backward_W), passes(True, backward_x, backward_W)):
            for a, e in zip(got, want):
                assert a.tobytes() == e.tobytes()
