"""kernels.relu: ReLU's gradient from its output, bit for bit numpy's formula, in place and apart."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.kernels.relu import relu_backward, sum_relu, sum_relu_backward


@pytest.mark.parametrize("shape", [(7,), (3, 5, 4), (4, 64, 30, 30)])
@pytest.mark.parametrize("slope", [0.0, 0.1, 2.0])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("into", ["gy", "y", "apart"])
def test_the_gradient_is_numpys_formula_bit_for_bit(xp, shape, slope, dtype, into):
    rng = numpy.random.default_rng(4)
    y = numpy.maximum(rng.standard_normal(shape), 0).astype(dtype)
    y.reshape(-1)[::5] = -0.0  # a zero of either sign is not positive
    gy = rng.standard_normal(shape).astype(dtype)
    gy.reshape(-1)[:3] = (numpy.inf, -numpy.inf, numpy.nan)
    positive = y > 0
    # slope 0: gy * False is -0.0 for a negative gy and NaN for an infinite one, as Caffe's gy * (y > 0)
    with numpy.errstate(invalid="ignore"):
        want = numpy.multiply(gy, positive) if slope == 0 else numpy.where(positive, gy, gy * slope)
    g, top = xp.asarray(gy), xp.asarray(y)
    gx = {"gy": g, "y": top, "apart": xp.full(shape, 7.0, dtype=dtype)}[into]
    assert relu_backward(g, top, slope, gx) is gx
    assert to_numpy(gx).tobytes() == want.tobytes()


@pytest.mark.parametrize("shape", [(7,), (3, 5, 4), (4, 64, 30, 30)])
@pytest.mark.parametrize("slope", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("wanted", [(True, True), (True, False), (False, False)])
def test_sum_relu_both_ways_are_the_two_layers_bit_for_bit(xp, shape, slope, dtype, wanted):
    rng = numpy.random.default_rng(5)
    a, b = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    b.reshape(-1)[:4] = -a.reshape(-1)[:4]  # sums of zero, of either sign
    a.reshape(-1)[4], a.reshape(-1)[5], b.reshape(-1)[5] = numpy.nan, -0.0, -0.0  # -0.0 + -0.0 is -0.0
    with numpy.errstate(invalid="ignore"):
        y = a + b
        want = numpy.maximum(y, 0) if slope == 0 else numpy.where(y > 0, y, y * slope)  # Eltwise, then ReLU
        gy = rng.standard_normal(shape).astype(dtype)
        want_g = numpy.multiply(gy, want > 0) if slope == 0 else numpy.where(want > 0, gy, gy * slope)
    out = xp.full(shape, 7.0, dtype=dtype)
    assert sum_relu(xp.asarray(a), xp.asarray(b), slope, out) is out
    assert to_numpy(out).tobytes() == want.tobytes()
    g = xp.asarray(gy)
    diffs = [xp.full(shape, 7.0, dtype=dtype) if w else None for w in wanted]
    sum_relu_backward(g, out, slope, *diffs)
    assert to_numpy(g).tobytes() == want_g.tobytes()  # the ReLU's gradient, in place in the top's diff
    for diff in diffs:
        assert diff is None or to_numpy(diff).tobytes() == want_g.tobytes()


@pytest.mark.parametrize("which", [0, 1])
def test_sum_relu_backward_into_the_memory_of_y(which):
    # the memory plan may give a bottom's diff the top's data buffer, which the ReLU's mask is read from
    rng = numpy.random.default_rng(6)
    y = numpy.maximum(rng.standard_normal((4, 8, 9, 9)), 0).astype(numpy.float32)
    gy = rng.standard_normal(y.shape).astype(numpy.float32)
    want = numpy.multiply(gy, y > 0)
    g, buffer, other = gy.copy(), y.copy(), numpy.empty_like(y)
    diffs = [other, other]
    diffs[which] = buffer
    sum_relu_backward(g, buffer, 0.0, *diffs)
    for a in (g, buffer, other):
        assert a.tobytes() == want.tobytes()
