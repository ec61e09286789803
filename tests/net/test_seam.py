"""The Net's seam: hooks per layer and per pass, the batch group, and diffs packed into one buffer."""
import numpy

import layerforge
from layerforge.blob import Blob, pack_data, pack_diffs
from tests.net.test_net import inputs, mlp


def test_hooks_run_around_every_layer_and_pass_in_order():
    net = layerforge.Net(mlp(), dtype="float64")  # input, ip1, relu1, ip2, loss
    events = []
    hooks = dict(before_forward=lambda i: events.append(("bf", i)), after_forward=lambda i: events.append(("af", i)),
                 before_backward=lambda i: events.append(("bb", i)), after_backward=lambda i: events.append(("ab", i)),
                 passes=lambda direction, finished: events.append((direction, finished)))
    net.add_hooks(**hooks)
    net.forward(**inputs())
    net.backward()
    assert events == ([("forward", False)] + [e for i in range(5) for e in (("bf", i), ("af", i))]
                      + [("forward", True), ("backward", False)]
                      + [e for i in reversed(range(5)) for e in (("bb", i), ("ab", i))] + [("backward", True)])
    events.clear()
    net.forward(start="ip2", end="loss")  # a range: the hooks of its layers, and the pass around them
    assert events == [("forward", False), ("bf", 3), ("af", 3), ("bf", 4), ("af", 4), ("forward", True)]
    net.remove_hooks(**hooks)
    events.clear()
    net.forward()
    net.backward()
    assert events == []


def test_an_after_backward_hook_sees_the_final_gradient_of_its_layer():
    net = layerforge.Net(mlp(), dtype="float64")
    seen = {}
    ip1 = net.layers[1]
    net.add_hooks(after_backward=lambda i: seen.setdefault(i, ip1.blobs[0].diff.copy()) if i == 1 else None)
    net.clear_param_diffs()
    net.forward(**inputs())
    net.backward()
    assert numpy.abs(seen[1]).sum() > 0
    numpy.testing.assert_array_equal(seen[1], ip1.blobs[0].diff)


class _Group:
    count = 2

    def sum(self, values):
        return 2 * numpy.asarray(values, numpy.float64)


def test_set_batch_group_reaches_the_layers_of_the_types_named():
    extra = [{"name": "bn", "type": "BatchNorm", "bottom": "ip2", "top": "bn"},
             {"name": "sink", "type": "Silence", "bottom": "bn"}]
    net = layerforge.Net(mlp(extra))
    group = _Group()
    assert net.set_batch_group(group, ("MultiBoxLoss",)) == []
    assert [layer.name for layer in net.set_batch_group(group, ("BatchNorm", "MultiBoxLoss"))] == ["bn"]
    assert net.layer_dict["bn"].batch_group is group


def test_packed_diffs_are_views_of_the_buffer_and_backward_writes_there():
    net = layerforge.Net(mlp(), dtype="float64")
    params = net.learnable_params
    sizes = [p.count for p in params]
    offsets = list(zip(numpy.cumsum([0] + sizes[:-1]).tolist(), sizes))
    for k, p in enumerate(params):
        p.diff[...] = k + 1
    buffer = numpy.zeros(sum(sizes))
    pack_diffs(params, buffer, offsets)
    numpy.testing.assert_array_equal(buffer, numpy.repeat(numpy.arange(1, len(params) + 1), sizes))  # values kept
    net.clear_param_diffs()
    net.forward(**inputs())
    net.backward()
    for p, (off, n) in zip(params, offsets):
        assert numpy.shares_memory(p.diff, buffer)
        numpy.testing.assert_array_equal(buffer[off:off + n], p.diff.reshape(-1))
    assert numpy.abs(buffer).sum() > 0


def test_packed_data_takes_the_buffer_s_values_except_the_kept_blobs():
    blobs = [Blob((2, 2), numpy.float64), Blob((3,), numpy.float64)]
    blobs[1].data[...] = 7
    buffer = numpy.arange(7, dtype=numpy.float64)
    pack_data(blobs, buffer, [(0, 4), (4, 3)], keep={1})
    numpy.testing.assert_array_equal(blobs[0].data, [[0, 1], [2, 3]])
    assert numpy.shares_memory(blobs[0].data, buffer) and blobs[1].data.tolist() == [7, 7, 7]


def test_cast_gives_data_and_diff_the_dtype():
    blob = Blob((2,), numpy.float32)
    blob.data[...] = 1.5
    blob.cast(numpy.float64)
    assert blob.dtype == blob.data.dtype == blob.diff.dtype == numpy.float64 and blob.data.tolist() == [1.5, 1.5]
