"""cupy.random on the emulated device: a seed gives one sequence, on every device and in every run."""
import numpy
import pytest

from tests.emulator.emulated import cupy  # noqa: F401 - the fixture


def test_a_seed_repeats_and_another_differs(cupy):
    seed = numpy.uint64(2 ** 63 + 5)
    a = cupy.random.RandomState(seed).standard_normal((4, 5), dtype=numpy.float32)
    b = cupy.random.RandomState(seed).standard_normal((4, 5), dtype=numpy.float32)
    with cupy.cuda.Device(1):
        c = cupy.random.RandomState(seed).standard_normal((4, 5), dtype=numpy.float32)
    d = cupy.random.RandomState(7).standard_normal((4, 5), dtype=numpy.float32)
    assert a.dtype == numpy.float32 and a.shape == (4, 5) and c.device.id == 1
    assert (a.get() == b.get()).all() and (a.get() == c.get()).all() and not (a.get() == d.get()).any()
    assert abs(float(cupy.random.RandomState(1).standard_normal(20000).mean())) < 0.05


def test_seeds_and_types_are_checked_as_cupy_does(cupy):
    with pytest.raises(TypeError, match="Seed must be an integer"):
        cupy.random.RandomState(1.5)
    with pytest.raises(ValueError, match="between 0 and 2\\*\\*64 - 1"):
        cupy.random.RandomState(-1)
    with pytest.raises(TypeError, match="only supports float32 and float64"):
        cupy.random.RandomState(1).standard_normal(3, dtype=numpy.int32)


def test_an_odd_draw_is_a_view_of_one_more(cupy):
    x = cupy.random.RandomState(3).uniform(2, 3, size=(3,), dtype=numpy.float64)
    assert x.base is not None and x.base.size == 4 and ((x.get() >= 2) & (x.get() < 3)).all()
    cupy.random.seed(11)
    first = cupy.random.rand(3).get()
    cupy.random.seed(11)
    assert (cupy.random.rand(3).get() == first).all()
