"""AbsVal, BNLL, Clip, Exp, Log, Power, Swish, Threshold: values by hand, gradients by finite differences,
PyTorch as an independent reference, in place and on every backend."""
import math

import numpy
import pytest

from layerforge import Net
from layerforge.blob import Blob
from layerforge.errors import ConfigError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob, run_layer

SHAPES = [(2, 3), (2, 3, 4), (2, 3, 2, 3)]
BLOCKS = {"Clip": "clip", "Exp": "exp", "Log": "log", "Power": "power", "Swish": "swish", "Threshold": "threshold"}


def make(type_, xp=numpy, **block):
    d = {"type": type_}
    if block:
        d[BLOCKS[type_]] = block
    return create_layer(d, dtype=numpy.float64, xp=xp)


X = numpy.array([[-2.0, -0.5, 0.0, 0.5, 3.0]])
G = numpy.array([[1.0, 2.0, -1.0, 0.5, 3.0]])

# (type, block, y(x), dy/dx(x)) worked out by hand from Caffe's definitions
CASES = [
    ("AbsVal", {}, lambda x: numpy.abs(x), lambda x: numpy.sign(x)),
    ("BNLL", {}, lambda x: numpy.log1p(numpy.exp(x)), lambda x: 1 / (1 + numpy.exp(-x))),
    ("Clip", {"min": -1.0, "max": 0.5}, lambda x: numpy.clip(x, -1, 0.5), lambda x: ((x >= -1) & (x <= 0.5)) * 1.0),
    ("Exp", {}, numpy.exp, numpy.exp),
    ("Exp", {"base": 2.0, "scale": 0.5, "shift": 1.0}, lambda x: 2 ** (1 + 0.5 * x),
     lambda x: 2 ** (1 + 0.5 * x) * math.log(2) * 0.5),
    ("Log", {"shift": 3.0}, lambda x: numpy.log(3 + x), lambda x: 1 / (3 + x)),
    ("Log", {"base": 10.0, "scale": 2.0, "shift": 5.0}, lambda x: numpy.log10(5 + 2 * x),
     lambda x: 2 / ((5 + 2 * x) * math.log(10))),
    ("Power", {"power": 2.0, "scale": 0.5, "shift": 3.0}, lambda x: (3 + 0.5 * x) ** 2,
     lambda x: 2 * 0.5 * (3 + 0.5 * x)),
    ("Power", {"power": 1.0, "scale": -2.0, "shift": 1.0}, lambda x: 1 - 2 * x, lambda x: -2 + 0 * x),
    ("Power", {"power": 0.0, "scale": 3.0}, lambda x: 1 + 0 * x, lambda x: 0 * x),
    ("Power", {"power": 3.0, "scale": 0.0, "shift": 2.0}, lambda x: 8 + 0 * x, lambda x: 0 * x),
    ("Swish", {}, lambda x: x / (1 + numpy.exp(-x)),
     lambda x: 1 / (1 + numpy.exp(-x)) + x * numpy.exp(-x) / (1 + numpy.exp(-x)) ** 2),
    ("Swish", {"beta": 2.5}, lambda x: x / (1 + numpy.exp(-2.5 * x)),
     lambda x: 1 / (1 + numpy.exp(-2.5 * x)) + 2.5 * x * numpy.exp(-2.5 * x) / (1 + numpy.exp(-2.5 * x)) ** 2),
]


@pytest.mark.parametrize("type_,block,f,df", CASES, ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("in_place", [False, True])
def test_values_and_gradients_by_hand(xp, type_, block, f, df, in_place):
    y, gx, _ = run_layer(make(type_, xp, **block), X, G, xp, in_place)
    numpy.testing.assert_allclose(y, f(X), rtol=1e-12, atol=1e-15)
    numpy.testing.assert_allclose(gx, G * df(X), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("type_,block,f,df", [c for c in CASES if c[0] not in ("AbsVal", "Clip")],
                         ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("shape", SHAPES)
def test_gradient_check(type_, block, f, df, shape):
    x = numpy.random.RandomState(0).uniform(-1.5, 1.5, shape)
    check_gradient(make(type_, **block), [make_blob(x)], [Blob()])


@pytest.mark.parametrize("type_,block", [("AbsVal", {}), ("Clip", {"min": -0.5, "max": 0.7})])
@pytest.mark.parametrize("shape", SHAPES)
def test_gradient_check_away_from_kinks(type_, block, shape):
    x = numpy.random.RandomState(1).uniform(-1.5, 1.5, shape)
    x[numpy.abs(x) < 0.05] = 0.3
    x[numpy.abs(numpy.abs(x - 0.1) - 0.6) < 0.05] = 0.3  # away from the clip bounds -0.5 and 0.7
    check_gradient(make(type_, **block), [make_blob(x)], [Blob()])


def test_torch_reference():
    torch = pytest.importorskip("torch")
    x = numpy.random.RandomState(2).uniform(-3, 3, (3, 4, 5))
    t = torch.tensor(x, requires_grad=True)
    refs = {
        ("AbsVal", ()): torch.abs,
        ("BNLL", ()): torch.nn.functional.softplus,
        ("Clip", (("min", -1.0), ("max", 2.0))): lambda v: torch.clamp(v, -1.0, 2.0),
        ("Exp", (("scale", 0.5),)): lambda v: torch.exp(0.5 * v),
        ("Log", (("shift", 4.0),)): lambda v: torch.log(4 + v),
        ("Power", (("power", 3.0), ("shift", 1.0))): lambda v: torch.pow(1 + v, 3),
        ("Swish", ()): torch.nn.functional.silu,
    }
    gy = numpy.random.RandomState(3).randn(*x.shape)
    for (type_, block), fn in refs.items():
        y, gx, _ = run_layer(make(type_, **dict(block)), x, gy)
        if t.grad is not None:
            t.grad = None
        ref = fn(t)
        ref.backward(torch.tensor(gy))
        numpy.testing.assert_allclose(y, ref.detach().numpy(), rtol=1e-10, err_msg=type_)
        numpy.testing.assert_allclose(gx, t.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=type_)


def test_threshold_is_a_step_without_backward(xp):
    layer = make("Threshold", xp, threshold=0.5)
    assert not layer.has_backward
    top = [Blob(dtype=numpy.float64, xp=xp)]
    bottom = [make_blob(X, xp=xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    numpy.testing.assert_array_equal(numpy.asarray(top[0].data.tolist()), [[0, 0, 0, 0, 1]])


def test_bnll_is_finite_for_large_inputs():
    y, gx, _ = run_layer(make("BNLL"), [[-1000.0, 1000.0]], [[1.0, 1.0]])
    numpy.testing.assert_allclose(y, [[0.0, 1000.0]])
    numpy.testing.assert_allclose(gx, [[0.0, 1.0]])


@pytest.mark.parametrize("type_,block,message", [
    ("Exp", {"base": -2.0}, "base must be positive or -1"),
    ("Log", {"base": 0.0}, "base must be positive or -1"),
    ("Log", {"base": 1.0}, "base 1 has no logarithm"),
    ("Clip", {"min": 1.0, "max": 0.0}, "min 1 is larger than max 0"),
    ("Clip", {"min": 1.0}, "required key is missing"),
])
def test_bad_parameters_are_one_line(type_, block, message):
    with pytest.raises(ConfigError, match=message):
        make(type_, **block)


def test_prototxt_with_these_types_converts_and_runs(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text("""name: "neurons"
input: "data" input_shape { dim: 2 dim: 3 }
layer { name: "abs" type: "AbsVal" bottom: "data" top: "abs" }
layer { name: "bnll" type: "BNLL" bottom: "abs" top: "bnll" }
layer { name: "pow" type: "Power" bottom: "bnll" top: "pow" power_param { power: 2 scale: 0.5 shift: 1 } }
layer { name: "exp" type: "Exp" bottom: "pow" top: "exp" exp_param { scale: -1 } }
layer { name: "log" type: "Log" bottom: "exp" top: "log" log_param { shift: 1 } }
layer { name: "clip" type: "Clip" bottom: "log" top: "log" clip_param { min: 0 max: 0.5 } }
layer { name: "swish" type: "Swish" bottom: "log" top: "swish" swish_param { beta: 2 } }
layer { name: "thr" type: "Threshold" bottom: "swish" top: "thr" threshold_param { threshold: 0.1 } }
""")
    net = Net(str(path), phase="test", dtype="float64")
    x = numpy.array([[-1.0, 0.0, 2.0], [0.5, -3.0, 1.0]])
    out = net.forward(data=x)
    bnll = numpy.log1p(numpy.exp(numpy.abs(x)))
    log = numpy.clip(numpy.log(1 + numpy.exp(-(1 + 0.5 * bnll) ** 2)), 0, 0.5)
    swish = log / (1 + numpy.exp(-2 * log))
    numpy.testing.assert_allclose(net.blobs["swish"].data, swish, rtol=1e-12)
    numpy.testing.assert_array_equal(out["thr"], swish > 0.1)


def test_v1_layer_enums_convert(tmp_path):
    path = tmp_path / "v1.prototxt"
    path.write_text("""name: "v1" input: "data" input_dim: 1 input_dim: 2 input_dim: 1 input_dim: 1
layers { name: "abs" type: ABSVAL bottom: "data" top: "abs" }
layers { name: "bnll" type: BNLL bottom: "abs" top: "bnll" }
layers { name: "pow" type: POWER bottom: "bnll" top: "pow" power_param { power: 2 } }
layers { name: "exp" type: EXP bottom: "pow" top: "exp" }
layers { name: "thr" type: THRESHOLD bottom: "exp" top: "thr" threshold_param { threshold: 2 } }
""")
    net = Net(str(path), phase="test", dtype="float64")
    assert [layer.type for layer in net.layers][1:] == ["AbsVal", "BNLL", "Power", "Exp", "Threshold"]
    out = net.forward(data=numpy.array([-0.1, 1.0]).reshape(1, 2, 1, 1))
    y = numpy.exp(numpy.log1p(numpy.exp([0.1, 1.0])) ** 2)
    numpy.testing.assert_array_equal(out["thr"].reshape(-1), y > 2)
