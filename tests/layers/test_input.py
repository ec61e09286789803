import numpy
import pytest

from layerforge import rng
from layerforge.blob import Blob
from layerforge.errors import ConfigError
from layerforge.layers import create_layer
from layerforge.net.netdef import load_net_def


def _setup(definition, n_top, phase="TRAIN", xp=numpy):
    layer = create_layer(definition, phase=phase, dtype=numpy.float64, xp=xp)
    top = [Blob((), numpy.float64, xp) for _ in range(n_top)]
    layer.setup([], top)
    return layer, top


@pytest.mark.parametrize("shape, n_top, expected", [
    ([[2, 3, 4, 4]], 1, [(2, 3, 4, 4)]),
    ([[5, 7]], 3, [(5, 7)] * 3),
    ([[2, 3], {"dim": [2]}], 2, [(2, 3), (2,)]),
    ([4, 1], 2, [(4, 1), (4, 1)]),
])
def test_input_shapes(xp, shape, n_top, expected):
    tops = [f"t{i}" for i in range(n_top)]
    layer, top = _setup({"type": "Input", "top": tops, "input": {"shape": shape}}, n_top, xp=xp)
    assert [t.shape for t in top] == expected
    assert not layer.has_backward and layer.backward_reads == ()


def test_input_forward_and_reshape_leave_tops_alone():
    layer, top = _setup({"type": "Input", "top": ["data"], "input": {"shape": [2, 3]}}, 1)
    top[0].data[...] = 7.0
    layer.forward([], top)
    numpy.testing.assert_array_equal(top[0].data, numpy.full((2, 3), 7.0))
    top[0].reshape(5, 3)  # a caller feeding a bigger batch
    layer.reshape([], top)
    assert top[0].shape == (5, 3)


def test_input_errors():
    with pytest.raises(ConfigError, match="2 shape entries for 3 tops"):
        create_layer({"type": "Input", "top": ["a", "b", "c"], "input": {"shape": [[1], [2]]}})
    with pytest.raises(ConfigError, match="required key is missing"):
        create_layer({"type": "Input", "top": ["a"]})
    with pytest.raises(ConfigError, match="non-negative"):
        create_layer({"type": "Input", "top": ["a"], "input": {"shape": [2, -1]}})


def test_legacy_net_inputs_become_an_input_layer():
    net = load_net_def({"input": ["data", "label"], "input_shape": [{"dim": [2, 3, 4, 4]}, {"dim": [2]}], "layers": []})
    lp = net.layers[0]
    assert lp.type == "Input" and lp.top == ["data", "label"]
    assert lp.input.shape == [(2, 3, 4, 4), (2,)]


def test_dummy_data_constant_filled_once_at_setup(xp):
    layer, top = _setup({"type": "DummyData", "top": ["a", "b"],
                         "dummy_data": {"shape": [[2, 3], [4]], "data_filler": {"type": "constant", "value": 2.5}}}, 2,
                        xp=xp)
    assert [t.shape for t in top] == [(2, 3), (4,)]
    assert float(top[0].data.sum()) == 15.0 and float(top[1].data.sum()) == 10.0
    top[0].data[...] = -1.0  # Caffe's semantics: constant tops are not refilled by forward
    layer.forward([], top)
    assert float(top[0].data.sum()) == -6.0 and not layer.has_backward


def test_dummy_data_default_is_zero():
    layer, top = _setup({"type": "DummyData", "top": ["a"], "dummy_data": {"shape": [3, 2]}}, 1)
    layer.forward([], top)
    numpy.testing.assert_array_equal(top[0].data, numpy.zeros((3, 2)))


def test_dummy_data_random_fillers_refill_each_forward():
    definition = {"type": "DummyData", "top": ["a", "b"],
                  "dummy_data": {"shape": [10, 20],
                                 "data_filler": [{"type": "gaussian", "std": 2.0}, {"type": "constant", "value": 1}]}}
    layer, top = _setup(definition, 2)
    layer.forward([], top)
    first = top[0].data.copy()
    layer.forward([], top)
    assert not numpy.allclose(first, top[0].data)
    assert abs(top[0].data.std() - 2.0) < 0.4
    numpy.testing.assert_array_equal(top[1].data, numpy.ones((10, 20)))
    # the draws come from layerforge.rng, so a reseed repeats them
    rng.seed(5)
    layer.forward([], top)
    again = top[0].data.copy()
    rng.seed(5)
    layer.forward([], top)
    numpy.testing.assert_array_equal(again, top[0].data)


def test_dummy_data_uniform_bounds():
    layer, top = _setup({"type": "DummyData", "top": ["a"],
                         "dummy_data": {"shape": [50, 4], "data_filler": {"type": "uniform", "min": 2, "max": 3}}}, 1)
    layer.forward([], top)
    assert top[0].data.min() >= 2 and top[0].data.max() <= 3


def test_dummy_data_legacy_shape():
    layer, top = _setup({"type": "DummyData", "top": ["a", "b"],
                         "dummy_data": {"num": 2, "channels": [3, 1], "height": 4, "width": 5}}, 2)
    assert [t.shape for t in top] == [(2, 3, 4, 5), (2, 1, 4, 5)]


@pytest.mark.parametrize("block, message", [
    ({"shape": [[1], [2], [3]]}, "3 shape entries for 2 tops"),
    ({"shape": [1], "data_filler": [{}, {}, {}]}, "3 data_filler entries for 2 tops"),
    ({}, "required key is missing"),
    ({"shape": [1], "num": 1}, "not both"),
    ({"num": 1, "channels": 1, "height": 1}, "need all of"),
])
def test_dummy_data_errors(block, message):
    with pytest.raises(ConfigError, match=message):
        create_layer({"type": "DummyData", "top": ["a", "b"], "dummy_data": block})


def test_dummy_data_integer_tops_draw_random_labels_in_range():
    layer = create_layer({"type": "DummyData", "top": ["data", "label"], "dummy_data": {
        "shape": [[2, 3], [500]], "data_filler": [{"type": "gaussian"}, {"type": "uniform", "min": 0, "max": 10}],
        "integer": [False, True]}}, dtype=numpy.float64)
    top = [Blob(), Blob()]
    layer.setup([], top)
    seen = []
    for _ in range(2):
        layer.forward([], top)
        labels = top[1].data.copy()
        numpy.testing.assert_array_equal(labels, numpy.floor(labels))
        assert labels.min() >= 0 and labels.max() <= 9
        assert len(numpy.unique(labels)) == 10  # 500 draws hit every class
        seen.append(labels)
    assert not numpy.array_equal(seen[0], seen[1])  # new labels every forward
    assert not numpy.array_equal(top[0].data, numpy.floor(top[0].data))  # data top stays real-valued
