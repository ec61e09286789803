"""kernels.relu: ReLU's gradient from its output, bit for bit numpy's formula, in place and apart."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.kernels.relu import relu_backward


@pytest.mark.parametrize("shape", [(7,), (3, 5, 4), (4, 64, 30, 30)])
@pytest.mark.parametrize("slope", [0.0, 0.1, 2.0])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("in_place", [True, False])
def test_the_gradient_is_numpys_formula_bit_for_bit(xp, shape, slope, dtype, in_place):
    rng = numpy.random.default_rng(4)
    y = numpy.maximum(rng.standard_normal(shape), 0).astype(dtype)
    y.reshape(-1)[::5] = -0.0  # a zero of either sign is not positive
    gy = rng.standard_normal(shape).astype(dtype)
    gy.reshape(-1)[:3] = (numpy.inf, -numpy.inf, numpy.nan)
    positive = y > 0
    # slope 0: gy * False is -0.0 for a negative gy and NaN for an infinite one, as Caffe's gy * (y > 0)
    with numpy.errstate(invalid="ignore"):
        want = numpy.multiply(gy, positive) if slope == 0 else numpy.where(positive, gy, gy * slope)
    g = xp.asarray(gy)
    gx = g if in_place else xp.full(shape, 7.0, dtype=dtype)
    assert relu_backward(g, xp.asarray(y), slope, gx) is gx
    assert to_numpy(gx).tobytes() == want.tobytes()
