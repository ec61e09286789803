import numpy
import pytest

from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

A = numpy.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]])
B = numpy.array([[2.0, 2.0, -1.0], [3.0, 4.0, 0.0]])
C = numpy.array([[-1.0, 5.0, 3.0], [0.5, 1.0, 2.0]])


def _host(a):
    return a if isinstance(a, numpy.ndarray) else a.get()


def _run(block, arrays, gy, xp=numpy, propagate_down=None):
    layer = create_layer({"type": "Eltwise", "bottom": [f"b{i}" for i in range(len(arrays))], "eltwise": block},
                         dtype=numpy.float64, xp=xp)
    bottom = []
    for a in arrays:
        b = Blob(a.shape, numpy.float64, xp)
        b.data[...] = xp.asarray(a)
        bottom.append(b)
    top = [Blob((), numpy.float64, xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = xp.asarray(gy)
    layer.backward(top, propagate_down or [True] * len(arrays), bottom)
    return _host(top[0].data), [_host(b.diff) for b in bottom]


def test_sum_default_and_coeff(xp):
    gy = numpy.arange(6.0).reshape(2, 3)
    y, (ga, gb) = _run({}, [A, B], gy, xp)
    numpy.testing.assert_array_equal(y, [[3, 0, 2], [3.5, 8, -1]])
    numpy.testing.assert_array_equal(ga, gy)
    numpy.testing.assert_array_equal(gb, gy)
    y, (ga, gb, gc) = _run({"operation": "sum", "coeff": [1, -1, 0.5]}, [A, B, C], gy, xp)
    numpy.testing.assert_array_equal(y, [[-1.5, -1.5, 5.5], [-2.25, 0.5, 0.0]])
    numpy.testing.assert_array_equal(gb, -gy)
    numpy.testing.assert_array_equal(gc, 0.5 * gy)


def test_prod(xp):
    gy = numpy.full((2, 3), 2.0)
    y, (ga, gb, gc) = _run({"operation": "PROD"}, [A, B, C], gy, xp)
    numpy.testing.assert_array_equal(y, [[-2, -20, -9], [0.75, 16, 0]])
    numpy.testing.assert_array_equal(ga, 2 * B * C)
    # stable gradient: exact although B has a zero
    numpy.testing.assert_array_equal(gb, [[-2, -20, 18], [0.5, 8, -4]])
    numpy.testing.assert_array_equal(gc, 2 * A * B)


def test_prod_unstable_gradient_is_y_over_x():
    gy = numpy.ones((2, 3))
    _, (ga, _) = _run({"operation": "PROD", "stable_prod_grad": False}, [A, C], gy)
    numpy.testing.assert_allclose(ga, A * C / A)


def test_max_with_caffe_ties(xp):
    a = numpy.array([1.0, 5.0, 2.0, 2.0, 0.0])
    b = numpy.array([1.0, 3.0, 4.0, 2.0, 0.0])
    c = numpy.array([0.0, 5.0, 4.0, 2.0, 1.0])
    gy = numpy.array([10.0, 20.0, 30.0, 40.0, 50.0])
    y, (ga, gb, gc) = _run({"operation": "max"}, [a, b, c], gy, xp)
    numpy.testing.assert_array_equal(y, [1, 5, 4, 2, 1])
    # ties between bottoms 0 and 1 go to 1; a later bottom must be strictly larger to win
    numpy.testing.assert_array_equal(ga, [0, 20, 0, 0, 0])
    numpy.testing.assert_array_equal(gb, [10, 0, 30, 40, 0])
    numpy.testing.assert_array_equal(gc, [0, 0, 0, 0, 50])


def test_propagate_down_leaves_other_diffs():
    layer = create_layer({"type": "Eltwise"}, dtype=numpy.float64)
    bottom, top = [make_blob(A), make_blob(B)], [Blob((), numpy.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    bottom[1].diff[...] = 7.0
    top[0].diff[...] = 1.0
    layer.backward(top, [True, False], bottom)
    assert (bottom[1].diff == 7.0).all() and (bottom[0].diff == 1.0).all()


def test_sum_in_place_with_coeff():
    layer = create_layer({"type": "Eltwise", "bottom": ["a", "b"], "top": ["a"], "eltwise": {"coeff": [2, 3]}},
                         dtype=numpy.float64)
    a, b = make_blob(A), make_blob(B)
    layer.setup([a, b], [a])
    layer.forward([a, b], [a])
    numpy.testing.assert_array_equal(a.data, 2 * A + 3 * B)
    a.diff[...] = 1.0
    layer.backward([a], [True, True], [a, b])
    assert (a.diff == 2.0).all() and (b.diff == 3.0).all()


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 2, 2)])
@pytest.mark.parametrize("block", [{"operation": "SUM", "coeff": [0.5, -2, 1.5]}, {"operation": "PROD"},
                                   {"operation": "PROD", "stable_prod_grad": False}, {"operation": "MAX"}])
def test_gradient(shape, block):
    g = numpy.random.default_rng(4)
    n = int(numpy.prod(shape))
    # distinct values at least 0.1 apart, so no MAX winner changes within the finite-difference step
    values = g.permutation(3 * n).astype(numpy.float64) / 10 + 0.5
    values *= g.choice([-1.0, 1.0], size=values.shape) if block["operation"] != "MAX" else 1.0
    bottom = [make_blob(values[i * n:(i + 1) * n].reshape(shape)) for i in range(3)]
    layer = create_layer({"type": "Eltwise", "bottom": ["a", "b", "c"], "eltwise": block}, dtype=numpy.float64)
    assert check_gradient(layer, bottom, [Blob((), numpy.float64)]) == 3 * n


def test_matches_torch():
    torch = pytest.importorskip("torch")
    g = numpy.random.default_rng(5)
    xs = [g.standard_normal((2, 4, 3)) for _ in range(3)]
    gy = g.standard_normal((2, 4, 3))
    for block, fn in [({"operation": "PROD"}, lambda a, b, c: a * b * c),
                      ({"operation": "MAX"}, lambda a, b, c: torch.maximum(torch.maximum(a, b), c)),
                      ({"coeff": [1, 2, -3]}, lambda a, b, c: a + 2 * b - 3 * c)]:
        y, grads = _run(block, xs, gy)
        ts = [torch.tensor(x, requires_grad=True) for x in xs]
        ty = fn(*ts)
        ty.backward(torch.from_numpy(gy))
        numpy.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12)
        for got, t in zip(grads, ts):
            numpy.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12)


def test_errors():
    with pytest.raises(ConfigError, match="gives 3 coefficients for 2 bottoms"):
        create_layer({"type": "Eltwise", "bottom": ["a", "b"], "eltwise": {"coeff": [1, 2, 3]}})
    with pytest.raises(ConfigError, match="coeff applies only to operation SUM, not MAX"):
        create_layer({"type": "Eltwise", "bottom": ["a", "b"], "eltwise": {"operation": "MAX", "coeff": [1, 2]}})
    with pytest.raises(ConfigError, match="PROD cannot compute in place"):
        create_layer({"type": "Eltwise", "bottom": ["a", "b"], "top": ["b"], "eltwise": {"operation": "PROD"}})
    with pytest.raises(ConfigError, match="did you mean"):
        create_layer({"type": "Eltwise", "eltwise": {"operation": "MAXX"}})
    layer = create_layer({"type": "Eltwise", "bottom": ["a", "b", "c"]})
    with pytest.raises(ShapeError, match=r"bottom\[2\] shape \(2, 4\) differs from bottom\[0\] shape \(2, 3\)") as e:
        layer.setup([make_blob(A), make_blob(B), make_blob(numpy.zeros((2, 4)))], [Blob()])
    assert e.value.key == "bottom[2]"
    with pytest.raises(ConfigError, match="at least 2 bottom"):
        layer.check_blob_counts(layer.layer_param, 1, 1)
