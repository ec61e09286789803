import math

import numpy
import pytest

from layerforge import rng
from layerforge.fillers import fill
from layerforge.schema import FILLER, Context, validate_block


def filler(**kw):
    return validate_block(kw, FILLER, Context())


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_constant(dtype):
    a = numpy.empty((3, 4), dtype)
    fill(a, filler(type="constant", value=2.5))
    assert (a == 2.5).all() and a.dtype == dtype


def test_uniform_range_and_mean():
    a = numpy.empty((200, 100))
    fill(a, filler(type="uniform", min=-2, max=3))
    assert a.min() >= -2 and a.max() <= 3
    assert abs(a.mean() - 0.5) < 5 * 5 / math.sqrt(12) / math.sqrt(a.size)


def test_gaussian_moments():
    a = numpy.empty((100, 200))
    fill(a, filler(type="gaussian", mean=1.0, std=0.5))
    assert abs(a.mean() - 1.0) < 5 * 0.5 / math.sqrt(a.size)
    assert abs(a.std() - 0.5) < 0.01


def test_gaussian_sparse_keeps_expected_fraction():
    a = numpy.empty((50, 400))
    fill(a, filler(type="gaussian", std=1.0, sparse=10))
    kept = (a != 0).mean()
    assert abs(kept - 10 / 50) < 0.01


@pytest.mark.parametrize("norm,n", [("FAN_IN", 3 * 5 * 5), ("FAN_OUT", 20 * 5 * 5), ("AVERAGE", (75 + 500) / 2)])
def test_xavier_bound(norm, n):
    a = numpy.empty((20, 3, 5, 5))
    fill(a, filler(type="xavier", variance_norm=norm))
    bound = math.sqrt(3.0 / n)
    assert numpy.abs(a).max() <= bound
    assert numpy.abs(a).max() > 0.95 * bound  # 1,500 draws reach the edge of the interval


def test_msra_std():
    a = numpy.empty((64, 32, 3, 3))
    fill(a, filler(type="msra"))
    assert abs(a.std() - math.sqrt(2.0 / (32 * 9))) < 0.005


def test_bilinear_upsampling_kernel():
    a = numpy.empty((2, 1, 4, 4))
    fill(a, filler(type="bilinear"))
    w1 = numpy.array([0.25, 0.75, 0.75, 0.25])
    numpy.testing.assert_allclose(a[0, 0], numpy.outer(w1, w1))
    numpy.testing.assert_allclose(a[1, 0], numpy.outer(w1, w1))


def test_fillers_are_reproducible_from_the_seed():
    a, b = numpy.empty(10), numpy.empty(10)
    rng.seed(7)
    fill(a, filler(type="gaussian"))
    rng.seed(7)
    fill(b, filler(type="gaussian"))
    numpy.testing.assert_array_equal(a, b)
