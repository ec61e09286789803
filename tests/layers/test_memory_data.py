import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError, ShapeError
from layerforge.layers import create_layer


def make(xp, batch_size=2, channels=3, height=2, width=1):
    layer = create_layer({"name": "mem", "type": "MemoryData", "top": ["data", "label"],
                          "memory_data": dict(batch_size=batch_size, channels=channels, height=height, width=width)},
                         dtype=numpy.float64, xp=xp)
    top = [Blob((), numpy.float64, xp), Blob((), numpy.float64, xp)]
    layer.setup([], top)
    return layer, top


@pytest.mark.parametrize("batch_size,n", [(2, 6), (3, 3), (1, 4)])
def test_cycles_through_the_rows_given(xp, batch_size, n):
    layer, top = make(xp, batch_size)
    assert top[0].shape == (batch_size, 3, 2, 1) and top[1].shape == (batch_size,)
    data = numpy.arange(n * 6, dtype=numpy.float32).reshape(n, 3, 2, 1)
    labels = numpy.arange(n) * 10
    layer.reset(data, labels)
    data[...] = -1  # the layer keeps its own copy
    for step in range(2 * n // batch_size + 1):
        layer.forward([], top)
        rows = (numpy.arange(batch_size) + step * batch_size) % n
        numpy.testing.assert_array_equal(to_numpy(top[0].data), numpy.arange(n * 6).reshape(n, 3, 2, 1)[rows])
        numpy.testing.assert_array_equal(to_numpy(top[1].data), rows * 10)


def test_reset_starts_over_and_takes_4d_labels():
    layer, top = make(numpy)
    layer.reset(numpy.ones((4, 3, 2, 1), numpy.float32), numpy.arange(4.0))
    layer.forward([], top)
    layer.reset(numpy.full((2, 3, 2, 1), 7, numpy.float32), numpy.array([5, 6]).reshape(2, 1, 1, 1))
    layer.forward([], top)
    numpy.testing.assert_array_equal(top[0].data, 7)
    numpy.testing.assert_array_equal(top[1].data, [5, 6])


@pytest.mark.parametrize("data,labels,error,message", [
    (numpy.ones((4, 3, 2, 1)), numpy.ones(4), DataError, "data must be float32, got float64"),
    (numpy.ones((4, 3, 2, 2), numpy.float32), numpy.ones(4), ShapeError, r"shape \(n, 3, 2, 1\), got \(4, 3, 2, 2\)"),
    (numpy.ones((4, 6), numpy.float32), numpy.ones(4), ShapeError, "got \\(4, 6\\)"),
    (numpy.ones((3, 3, 2, 1), numpy.float32), numpy.ones(3), ShapeError, "rows 3 must be a positive multiple of "
                                                                        "batch_size 2"),
    (numpy.ones((0, 3, 2, 1), numpy.float32), numpy.ones(0), ShapeError, "rows 0 must be a positive"),
    (numpy.ones((4, 3, 2, 1), numpy.float32), numpy.ones(2), ShapeError, "labels must be 4 numbers"),
    (numpy.ones((4, 3, 2, 1), numpy.float32), numpy.array(["a"] * 4), ShapeError, "labels must be 4 numbers"),
])
def test_bad_arrays_are_one_line_errors(data, labels, error, message):
    layer, _ = make(numpy)
    with pytest.raises(error, match=message) as e:
        layer.reset(data, labels)
    assert "layer 'mem' (MemoryData): reset" in str(e.value) and "\n" not in str(e.value)


def test_forward_before_reset_is_one_line():
    layer, top = make(numpy)
    with pytest.raises(DataError, match=r"layer 'mem' \(MemoryData\): no data: call reset\(data, labels\)"):
        layer.forward([], top)


def test_missing_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="memory_data.channels"):
        create_layer({"type": "MemoryData", "top": ["data", "label"],
                      "memory_data": {"batch_size": 2, "height": 2, "width": 2}})


def test_caffe_prototxt_converts_and_net_reaches_the_layer(tmp_path):
    from layerforge.net import Net
    path = tmp_path / "net.prototxt"
    path.write_text("""name: "mem"
layers { name: "mem" type: MEMORY_DATA top: "data" top: "label"
         memory_data_param { batch_size: 2 channels: 1 height: 1 width: 3 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip"
         inner_product_param { num_output: 1 weight_filler { type: "constant" value: 1 } } }
layers { name: "loss" type: EUCLIDEAN_LOSS bottom: "ip" bottom: "label" top: "loss" }
""")
    net = Net(str(path), phase="train", dtype="float64")
    x = numpy.arange(12, dtype=numpy.float32).reshape(4, 1, 1, 3)
    net.layer_dict["mem"].reset(x, numpy.array([3.0, 12.0, 0.0, 0.0]))
    net.forward()
    # ip = row sums 3, 12 match the labels exactly: loss 0
    assert net.loss == 0.0
    net.forward()
    numpy.testing.assert_array_equal(net.blobs["ip"].data.reshape(-1), [21, 30])
    assert net.loss == pytest.approx((21 ** 2 + 30 ** 2) / (2 * 2))
