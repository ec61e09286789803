import numpy
import pytest

from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def _blobs(arrays, xp=numpy):
    out = []
    for a in arrays:
        b = Blob(a.shape, numpy.float64, xp)
        b.data[...] = xp.asarray(a)
        out.append(b)
    return out


def _tops(n):
    return [Blob((), numpy.float64) for _ in range(n)]


def _host(a):
    return a if isinstance(a, numpy.ndarray) else a.get()


def _arange(shape, start=0):
    return numpy.arange(start, start + numpy.prod(shape), dtype=numpy.float64).reshape(shape)


@pytest.mark.parametrize("shapes, block, axis", [
    ([(2, 3, 4), (2, 5, 4)], {}, 1),
    ([(1, 3), (4, 3), (2, 3)], {"axis": 0}, 0),
    ([(2, 3, 1), (2, 3, 2)], {"axis": -1}, 2),
    ([(2, 3, 4), (5, 3, 4)], {"concat_dim": 0}, 0),
    ([(3, 2)], {}, 1),
])
def test_concat(xp, shapes, block, axis):
    arrays = [_arange(s, 100 * i) for i, s in enumerate(shapes)]
    layer = create_layer({"type": "Concat", "concat": block}, dtype=numpy.float64, xp=xp)
    bottom, top = _blobs(arrays, xp), [Blob((), numpy.float64, xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    numpy.testing.assert_array_equal(_host(top[0].data), numpy.concatenate(arrays, axis=axis))
    top[0].diff[...] = top[0].data * 2
    layer.backward(top, [True] * len(bottom), bottom)
    for a, b in zip(arrays, bottom):
        numpy.testing.assert_array_equal(_host(b.diff), 2 * a)


def test_concat_propagate_down_and_torch():
    torch = pytest.importorskip("torch")
    g = numpy.random.default_rng(0)
    arrays = [g.standard_normal((2, k, 3)) for k in (1, 4, 2)]
    layer = create_layer({"type": "Concat"}, dtype=numpy.float64)
    bottom, top = _blobs(arrays), _tops(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    numpy.testing.assert_array_equal(top[0].data, torch.cat([torch.from_numpy(a) for a in arrays], 1).numpy())
    bottom[1].diff[...] = 9.0
    top[0].diff[...] = 1.0
    layer.backward(top, [True, False, True], bottom)
    assert (bottom[1].diff == 9.0).all() and (bottom[0].diff == 1.0).all() and (bottom[2].diff == 1.0).all()


def test_concat_gradient():
    g = numpy.random.default_rng(1)
    layer = create_layer({"type": "Concat", "concat": {"axis": 2}}, dtype=numpy.float64)
    bottom = [make_blob(g.standard_normal((2, 2, k))) for k in (1, 3)]
    assert check_gradient(layer, bottom, _tops(1)) == 16


def test_concat_errors():
    layer = create_layer({"type": "Concat"}, dtype=numpy.float64)
    message = r"bottom\[2\] shape \(3, 2, 5\) does not match bottom\[0\] shape \(2, 2, 5\)"
    with pytest.raises(ShapeError, match=message) as e:
        layer.setup(_blobs([numpy.zeros((2, 2, 5)), numpy.zeros((2, 1, 5)), numpy.zeros((3, 2, 5))]), _tops(1))
    assert e.value.key == "bottom[2]"
    with pytest.raises(ShapeError, match="does not match"):
        layer.setup(_blobs([numpy.zeros((2, 2, 5)), numpy.zeros((2, 2))]), _tops(1))
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        create_layer({"type": "Concat", "concat": {"axis": 3}}).setup(_blobs([numpy.zeros((1, 2))] * 2), _tops(1))
    with pytest.raises(ConfigError, match="not both"):
        create_layer({"type": "Concat", "concat": {"axis": 0, "concat_dim": 0}})


@pytest.mark.parametrize("shape, block, n_top, sizes, axis", [
    ((2, 10, 3), {"slice_point": [2, 5]}, 3, [2, 3, 5], 1),
    ((6, 4), {"axis": 0}, 3, [2, 2, 2], 0),
    ((2, 3, 8), {"axis": -1, "slice_point": 1}, 2, [1, 7], 2),
    ((4, 6), {"slice_dim": 0, "slice_point": [3]}, 2, [3, 1], 0),
    ((2, 3), {}, 1, [3], 1),
])
def test_slice(xp, shape, block, n_top, sizes, axis):
    x = _arange(shape)
    layer = create_layer({"type": "Slice", "top": [f"t{i}" for i in range(n_top)], "slice": block},
                         dtype=numpy.float64, xp=xp)
    bottom, top = _blobs([x], xp), [Blob((), numpy.float64, xp) for _ in range(n_top)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    expected = numpy.split(x, numpy.cumsum(sizes)[:-1], axis=axis)
    for t, e in zip(top, expected):
        numpy.testing.assert_array_equal(_host(t.data), e)
        t.diff[...] = -t.data
    layer.backward(top, [True], bottom)
    numpy.testing.assert_array_equal(_host(bottom[0].diff), -x)


def test_slice_matches_torch_split():
    torch = pytest.importorskip("torch")
    x = numpy.random.default_rng(0).standard_normal((3, 7))
    layer = create_layer({"type": "Slice", "top": ["a", "b", "c"], "slice": {"slice_point": [2, 3]}},
                         dtype=numpy.float64)
    bottom, top = _blobs([x]), _tops(3)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    for t, r in zip(top, torch.split(torch.from_numpy(x), [2, 1, 4], dim=1)):
        numpy.testing.assert_array_equal(t.data, r.numpy())


def test_slice_gradient():
    layer = create_layer({"type": "Slice", "top": ["a", "b"], "slice": {"axis": 0}}, dtype=numpy.float64)
    assert check_gradient(layer, [make_blob(numpy.random.default_rng(2).standard_normal((4, 3)))],
                          _tops(2)) == 12


def test_slice_errors():
    layer = create_layer({"type": "Slice", "top": ["a", "b", "c"]}, dtype=numpy.float64)
    with pytest.raises(ShapeError, match=r"size 4\) of bottom shape \(2, 4\) does not split evenly into 3"):
        layer.setup(_blobs([numpy.zeros((2, 4))]), _tops(3))
    layer = create_layer({"type": "Slice", "top": ["a", "b"], "slice": {"slice_point": 4}}, dtype=numpy.float64)
    with pytest.raises(ShapeError, match="slice point 4 is not inside axis 1"):
        layer.setup(_blobs([numpy.zeros((2, 4))]), _tops(2))
    with pytest.raises(ConfigError, match="2 slice points make 3 pieces, but there are 2 tops"):
        create_layer({"type": "Slice", "top": ["a", "b"], "slice": {"slice_point": [1, 2]}})
    with pytest.raises(ConfigError, match="increase strictly"):
        create_layer({"type": "Slice", "top": ["a", "b", "c"], "slice": {"slice_point": [2, 2]}})


@pytest.mark.parametrize("n_top", [1, 2, 3])
def test_split_shares_data_and_sums_diffs(xp, n_top):
    x = _arange((2, 3))
    layer = create_layer({"type": "Split", "bottom": ["x"], "top": [f"x_s{i}" for i in range(n_top)]},
                         dtype=numpy.float64, xp=xp)
    bottom, top = _blobs([x], xp), [Blob((), numpy.float64, xp) for _ in range(n_top)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    for i, t in enumerate(top):
        assert t.data is bottom[0].data and t.shape == (2, 3)
        t.diff[...] = xp.asarray(x * (i + 1))
    layer.backward(top, [True], bottom)
    numpy.testing.assert_array_equal(_host(bottom[0].diff), x * n_top * (n_top + 1) / 2)


def test_split_follows_a_replaced_bottom():
    layer = create_layer({"type": "Split", "top": ["a", "b"]}, dtype=numpy.float64)
    bottom, top = _blobs([numpy.zeros((2, 2))]), _tops(2)
    layer.setup(bottom, top)
    bottom[0].reshape(5, 1)
    layer.reshape(bottom, top)
    bottom[0].data[...] = 4.0
    layer.forward(bottom, top)
    assert top[1].shape == (5, 1) and (top[1].data == 4.0).all() and top[1].diff.shape == (5, 1)


def test_split_gradient():
    layer = create_layer({"type": "Split", "top": ["a", "b", "c"]}, dtype=numpy.float64)
    assert check_gradient(layer, [make_blob(numpy.random.default_rng(3).standard_normal((3, 2)))],
                          _tops(3)) == 6
