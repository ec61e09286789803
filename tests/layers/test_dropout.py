import math

import numpy
import pytest

from layerforge import rng
from layerforge.blob import Blob
from layerforge.errors import ConfigError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob, run_layer


def dropout(phase="TRAIN", xp=numpy, **block):
    return create_layer({"type": "Dropout", "dropout": block}, phase=phase, dtype=numpy.float64, xp=xp)


def run(layer, x, gy, xp=numpy, in_place=False):
    return run_layer(layer, x, gy, xp, in_place)[:2]


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4, 5)])
def test_test_phase_is_identity(xp, in_place, shape):
    rs = numpy.random.default_rng(0)
    x, gy = rs.standard_normal(shape), rs.standard_normal(shape)
    y, gx = run(dropout("TEST", xp, dropout_ratio=0.7), x, gy, xp, in_place)
    numpy.testing.assert_array_equal(y, x)
    numpy.testing.assert_array_equal(gx, gy)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("ratio", [0.2, 0.5, 0.75])
def test_train_scales_kept_units_and_masks_gradient(xp, in_place, ratio):
    rs = numpy.random.default_rng(1)
    x, gy = rs.uniform(1, 2, (4, 50)), rs.standard_normal((4, 50))  # x > 0: a zero output means dropped
    y, gx = run(dropout("TRAIN", xp, dropout_ratio=ratio), x, gy, xp, in_place)
    kept = y != 0
    assert 0 < kept.sum() < kept.size
    scale = 1 / (1 - ratio)
    numpy.testing.assert_allclose(y[kept], x[kept] * scale, rtol=1e-14)
    numpy.testing.assert_allclose(gx, numpy.where(kept, gy * scale, 0.0), rtol=1e-14)


def test_ratio_zero_keeps_everything():
    x = numpy.arange(6.0).reshape(2, 3) + 1
    y, gx = run(dropout(dropout_ratio=0.0), x, numpy.ones((2, 3)))
    numpy.testing.assert_array_equal(y, x)
    numpy.testing.assert_array_equal(gx, numpy.ones((2, 3)))


def test_mask_follows_the_seed():
    x = numpy.ones((8, 16))

    def forward_with_seed(s):
        rng.seed(s)
        return run(dropout(), x, x)[0]

    numpy.testing.assert_array_equal(forward_with_seed(5), forward_with_seed(5))
    assert (forward_with_seed(5) != forward_with_seed(6)).any()


def test_train_mean_is_preserved():
    # mask m = B / (1 - p), B ~ Bernoulli(1 - p): E[m] = 1 and Var[m] = p / (1 - p), so the mean of n masked
    # ones has standard deviation sqrt(p / ((1 - p) n)); the kept fraction has sqrt(p (1 - p) / n).
    p, n = 0.3, 200_000
    y, _ = run(dropout(dropout_ratio=p), numpy.ones((n // 1000, 1000)), numpy.ones((n // 1000, 1000)))
    assert abs(y.mean() - 1.0) < 5 * math.sqrt(p / ((1 - p) * n))
    assert abs((y != 0).mean() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 2, 2)])
def test_gradient(shape):
    # check_gradient restores the rng before each forward, so every evaluation draws the same mask
    x = numpy.random.default_rng(2).standard_normal(shape)
    check_gradient(dropout(dropout_ratio=0.4), [make_blob(x)], [Blob()])


@pytest.mark.parametrize("ratio", [1.0, 1.5, -0.1])
def test_ratio_out_of_range_is_a_config_error(ratio):
    with pytest.raises(ConfigError, match="dropout_ratio"):
        dropout(dropout_ratio=ratio)


@pytest.mark.parametrize("in_place", [False, True])
def test_scale_train_false_scales_at_test_time(xp, in_place):
    # Fast R-CNN's fork (its ZF net): TRAIN keeps the dropped-out values unscaled, TEST multiplies by 1 - p
    x, gy = numpy.full((4, 50), 2.0), numpy.full((4, 50), 3.0)
    y, gx = run(dropout("TEST", xp, dropout_ratio=0.25, scale_train=False), x, gy, xp, in_place)
    numpy.testing.assert_allclose(y, 1.5)
    numpy.testing.assert_allclose(gx, 2.25)
    y, gx = run(dropout("TRAIN", xp, dropout_ratio=0.25, scale_train=False), x, gy, xp, in_place)
    assert set(numpy.unique(y)) == {0.0, 2.0} and set(numpy.unique(gx)) == {0.0, 3.0}
    numpy.testing.assert_array_equal(y == 0, gx == 0)


@pytest.mark.parametrize("in_place", [False, True])
def test_sample_weights_test_drops_in_test_as_in_train(xp, in_place):
    # the SegNet / ENet forks' Monte Carlo dropout (Bayesian SegNet): TEST samples a mask and scales as TRAIN does
    rs = numpy.random.default_rng(4)
    x, gy = rs.uniform(1, 2, (4, 50)), rs.standard_normal((4, 50))
    rng.seed(7)
    y, gx = run(dropout("TEST", xp, dropout_ratio=0.3, sample_weights_test=True), x, gy, xp, in_place)
    kept = y != 0
    assert 0 < kept.sum() < kept.size
    numpy.testing.assert_allclose(y[kept], x[kept] / 0.7, rtol=1e-14)
    numpy.testing.assert_allclose(gx, numpy.where(kept, gy / 0.7, 0.0), rtol=1e-14)
    rng.seed(7)  # the same draw as TRAIN's
    y_train, _ = run(dropout("TRAIN", xp, dropout_ratio=0.3), x, gy, xp, in_place)
    numpy.testing.assert_array_equal(y, y_train)


def test_sample_weights_test_gradient():
    x = numpy.random.default_rng(5).standard_normal((3, 4, 2))
    check_gradient(dropout("TEST", dropout_ratio=0.4, sample_weights_test=True), [make_blob(x)], [Blob()])
