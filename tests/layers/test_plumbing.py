"""ArgMax, BatchReindex, Bias, Crop, Filter, MVN, Parameter, Reduction, Silence, SPP, Tile: Caffe's semantics by
hand, finite-difference gradients and PyTorch references."""
import math

import numpy
import pytest

from layerforge import Net
from layerforge.blob import Blob
from layerforge.solvers.caffe_import import convert_file
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer
from layerforge.layers.spp import FLT_MAX
from layerforge.testing import check_gradient, make_blob
from tests.kernels.test_pooling import caffe_pooling

RS = numpy.random.RandomState(11)


def make(type_, xp=numpy, bottoms=1, tops=1, **blocks):
    return create_layer({"type": type_, "bottom": [f"b{i}" for i in range(bottoms)],
                         "top": [f"t{i}" for i in range(tops)], **blocks}, dtype=numpy.float64, xp=xp)


def forward(layer, arrays, xp=numpy, tops=1):
    bottom = [make_blob(a, xp=xp) for a in arrays]
    top = [Blob(dtype=numpy.float64, xp=xp) for _ in range(tops)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return bottom, top


def host(a):
    return numpy.asarray(a.tolist())


# -- ArgMax ---------------------------------------------------------------------------------------

def test_argmax_per_item_with_values_and_ties(xp):
    x = numpy.array([[3.0, 1.0, 3.0, 2.0], [0.0, 5.0, 4.0, 4.0]])
    _, top = forward(make("ArgMax", xp, argmax={"top_k": 2, "out_max_val": True}), [x], xp)
    assert top[0].shape == (2, 2, 2)
    # ties: the larger index first (Caffe's partial sort of (value, index) pairs, greater first)
    numpy.testing.assert_array_equal(host(top[0].data), [[[2, 0], [3, 3]], [[1, 3], [5, 4]]])


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_argmax_along_an_axis_matches_torch(axis):
    torch = pytest.importorskip("torch")
    x = RS.randn(3, 4, 5)
    _, top = forward(make("ArgMax", argmax={"axis": axis, "top_k": 2}), [x])
    values, index = torch.topk(torch.tensor(x), 2, dim=axis)
    numpy.testing.assert_array_equal(top[0].data, index.numpy())
    _, top = forward(make("ArgMax", argmax={"axis": axis, "top_k": 2, "out_max_val": True}), [x])
    numpy.testing.assert_array_equal(top[0].data, values.numpy())


def test_argmax_top_k_larger_than_the_values():
    with pytest.raises(ConfigError, match="top_k 5 is more than the 4 values"):
        Net({"name": "n", "layers": [{"name": "x", "type": "Input", "top": "x", "input": {"shape": [[2, 4]]}},
                                     {"name": "a", "type": "ArgMax", "bottom": "x", "top": "a", "argmax": {"top_k": 5}}]})


# -- BatchReindex, Filter, Crop, Tile -------------------------------------------------------------

def test_batch_reindex_forward_and_accumulating_backward(xp):
    x = RS.randn(4, 2, 3)
    permut = numpy.array([2.0, 0.0, 2.0])
    layer = make("BatchReindex", xp, bottoms=2)
    bottom, top = forward(layer, [x, permut], xp)
    numpy.testing.assert_array_equal(host(top[0].data), x[[2, 0, 2]])
    gy = RS.randn(3, 2, 3)
    top[0].diff[...] = xp.asarray(gy)
    layer.backward(top, [True, False], bottom)
    want = numpy.zeros_like(x)
    want[2] = gy[0] + gy[2]
    want[0] = gy[1]
    numpy.testing.assert_allclose(host(bottom[0].diff), want)
    check_gradient(make("BatchReindex", bottoms=2), [make_blob(x), make_blob(permut)], [Blob()], check_bottom=[0])
    with pytest.raises(DataError, match=r"index 4 at position 1 is outside the batch \[0, 4\)"):
        forward(make("BatchReindex", bottoms=2), [x, numpy.array([0.0, 4.0])])


def test_filter_keeps_selected_items(xp):
    a, b = RS.randn(5, 3), RS.randn(5, 2, 2)
    selector = numpy.array([1.0, 0.0, 0.0, 2.0, 1.0])
    layer = make("Filter", xp, bottoms=3, tops=2)
    bottom, top = forward(layer, [a, b, selector], xp, tops=2)
    numpy.testing.assert_array_equal(host(top[0].data), a[[0, 3, 4]])
    numpy.testing.assert_array_equal(host(top[1].data), b[[0, 3, 4]])
    for t in top:
        t.diff[...] = 1
    layer.backward(top, [True, True, False], bottom)
    numpy.testing.assert_array_equal(host(bottom[0].diff)[:, 0], [1, 0, 0, 1, 1])
    check_gradient(make("Filter", bottoms=2), [make_blob(a), make_blob(selector)], [Blob()], check_bottom=[0])


@pytest.mark.parametrize("axis,offset,ref_shape", [(2, [1], (2, 3, 4, 3)), (1, [0, 2, 1], (2, 2, 3, 3)),
                                                   (-1, [], (2, 3, 6, 2))])
def test_crop_matches_slicing(xp, axis, offset, ref_shape):
    x = RS.randn(2, 3, 6, 5)
    layer = make("Crop", xp, bottoms=2, crop={"axis": axis, "offset": offset})
    _, top = forward(layer, [x, numpy.zeros(ref_shape)], xp)
    a = axis % 4
    starts = [0] * a + ([offset[0]] * (4 - a) if len(offset) == 1 else (offset or [0] * (4 - a)))
    window = tuple(slice(s, s + (x.shape[i] if i < a else ref_shape[i])) for i, s in enumerate(starts))
    numpy.testing.assert_array_equal(host(top[0].data), x[window])
    check_gradient(make("Crop", bottoms=2, crop={"axis": axis, "offset": offset}),
                   [make_blob(x), make_blob(numpy.zeros(ref_shape))], [Blob()], check_bottom=[0])


def test_crop_out_of_bounds_is_one_line():
    with pytest.raises(ConfigError, match=r"the crop of axis 2 \(offset 3, size 4\) is out of bounds for size 6"):
        Net({"name": "n", "layers": [
            {"name": "x", "type": "Input", "top": ["x", "r"], "input": {"shape": [[1, 1, 6, 6], [1, 1, 4, 4]]}},
            {"name": "c", "type": "Crop", "bottom": ["x", "r"], "top": "c", "crop": {"offset": [3]}}]})


@pytest.mark.parametrize("axis,tiles", [(0, 2), (1, 3), (-1, 2)])
def test_tile_matches_numpy_tile(xp, axis, tiles):
    x = RS.randn(2, 3, 4)
    _, top = forward(make("Tile", xp, tile={"axis": axis, "tiles": tiles}), [x], xp)
    reps = [1, 1, 1]
    reps[axis] = tiles
    numpy.testing.assert_array_equal(host(top[0].data), numpy.tile(x, reps))
    check_gradient(make("Tile", tile={"axis": axis, "tiles": tiles}), [make_blob(x)], [Blob()])



def torch_forward_backward(fn, x, gy):
    """PyTorch's fn(x) and the gradient of <fn(x), gy> with respect to x."""
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x, requires_grad=True)
    y = fn(tx)
    y.backward(torch.tensor(gy).reshape(y.shape))
    return y.detach().numpy(), tx.grad.numpy()


def layer_forward_backward(layer, arrays, gy, xp, down):
    bottom, top = forward(layer, arrays, xp)
    top[0].diff[...] = xp.asarray(gy).reshape(top[0].shape)
    layer.backward(top, down, bottom)
    return host(top[0].data), host(bottom[0].diff)


def test_batch_reindex_tile_crop_match_torch(xp):
    torch = pytest.importorskip("torch")
    x = RS.randn(4, 3, 5)
    permut = numpy.array([3.0, 1.0, 3.0, 3.0, 0.0])
    gy = RS.randn(5, 3, 5)
    got = layer_forward_backward(make("BatchReindex", xp, bottoms=2), [x, permut], gy, xp, [True, False])
    want = torch_forward_backward(lambda t: torch.index_select(t, 0, torch.tensor([3, 1, 3, 3, 0])), x, gy)
    for g, w in zip(got, want):
        numpy.testing.assert_allclose(g, w)
    gy = RS.randn(4, 6, 5)
    got = layer_forward_backward(make("Tile", xp, tile={"tiles": 2}), [x], gy, xp, [True])
    want = torch_forward_backward(lambda t: torch.tile(t, (1, 2, 1)), x, gy)
    for g, w in zip(got, want):
        numpy.testing.assert_allclose(g, w)
    gy = RS.randn(4, 2, 3)
    got = layer_forward_backward(make("Crop", xp, bottoms=2, crop={"axis": 1, "offset": [1, 2]}),
                                 [x, numpy.zeros((4, 2, 3))], gy, xp, [True, False])
    want = torch_forward_backward(lambda t: t.narrow(1, 1, 2).narrow(2, 2, 3), x, gy)
    for g, w in zip(got, want):
        numpy.testing.assert_allclose(g, w)


@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
def test_reduction_matches_torch(xp, op):
    torch = pytest.importorskip("torch")
    x, gy = RS.randn(2, 3, 4), RS.randn(2, 3)
    fn = {"SUM": lambda t: t.sum(2), "ASUM": lambda t: t.abs().sum(2), "SUMSQ": lambda t: (t * t).sum(2),
          "MEAN": lambda t: t.mean(2)}[op]
    got = layer_forward_backward(make("Reduction", xp, reduction={"operation": op, "axis": 2, "coeff": 0.5}),
                                 [x], gy, xp, [True])
    want = torch_forward_backward(lambda t: 0.5 * fn(t), x, gy)
    for g, w in zip(got, want):
        numpy.testing.assert_allclose(g, w, rtol=1e-12)

# -- Bias, MVN, Reduction, Parameter, Silence -----------------------------------------------------

@pytest.mark.parametrize("shape,block", [((2, 3, 4), {}), ((2, 3, 4), {"axis": 0, "num_axes": 2}),
                                         ((2, 3, 4), {"num_axes": 0}), ((2, 3, 4), {"num_axes": -1})])
def test_bias_learned(shape, block):
    x = RS.randn(*shape)
    layer = make("Bias", bias={**block, "filler": {"type": "gaussian"}})
    _, top = forward(layer, [x])
    b = layer.blobs[0].data
    axis = block.get("axis", 1)
    numpy.testing.assert_allclose(top[0].data, x + b.reshape(b.shape + (1,) * (len(shape) - axis - b.ndim)))
    check_gradient(make("Bias", bias={**block, "filler": {"type": "gaussian"}}), [make_blob(x)], [Blob()])


def test_bias_from_a_second_bottom_matches_torch(xp):
    torch = pytest.importorskip("torch")
    x, b = RS.randn(2, 3, 4, 5), RS.randn(3, 4)
    layer = make("Bias", xp, bottoms=2)
    bottom, top = forward(layer, [x, b], xp)
    gy = RS.randn(2, 3, 4, 5)
    top[0].diff[...] = xp.asarray(gy)
    layer.backward(top, [True, True], bottom)
    tx, tb = torch.tensor(x, requires_grad=True), torch.tensor(b, requires_grad=True)
    y = tx + tb[None, :, :, None]
    y.backward(torch.tensor(gy))
    numpy.testing.assert_allclose(host(top[0].data), y.detach().numpy())
    numpy.testing.assert_allclose(host(bottom[1].diff), tb.grad.numpy())
    numpy.testing.assert_allclose(host(bottom[0].diff), tx.grad.numpy())


@pytest.mark.parametrize("normalize_variance", [True, False])
@pytest.mark.parametrize("across_channels", [False, True])
def test_mvn(xp, normalize_variance, across_channels):
    x = RS.randn(2, 3, 4, 5) * 3 + 1
    block = {"normalize_variance": normalize_variance, "across_channels": across_channels}
    _, top = forward(make("MVN", xp, mvn=block), [x], xp)
    axes = (1, 2, 3) if across_channels else (2, 3)
    want = x - x.mean(axis=axes, keepdims=True)
    if normalize_variance:
        want = want / (want.std(axis=axes, keepdims=True) + 1e-9)
    numpy.testing.assert_allclose(host(top[0].data), want, rtol=1e-10, atol=1e-12)
    check_gradient(make("MVN", mvn=block), [make_blob(x[:, :, :2, :3])], [Blob()])



def test_mvn_adds_eps_to_the_standard_deviation(xp):
    x = numpy.array([[[[1.0, 3.0]]]])  # mean 2, std 1: Caffe gives (x - 2) / (1 + eps), not / sqrt(1 + eps)
    _, top = forward(make("MVN", xp, mvn={"eps": 0.5}), [x], xp)
    numpy.testing.assert_allclose(host(top[0].data).reshape(-1), [-1 / 1.5, 1 / 1.5])

@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_reduction(xp, op, axis):
    x = RS.randn(2, 3, 4)
    x[numpy.abs(x) < 0.05] = 0.5  # ASUM's kink at 0
    _, top = forward(make("Reduction", xp, reduction={"operation": op, "axis": axis, "coeff": -1.5}), [x], xp)
    flat = x.reshape(int(numpy.prod(x.shape[:axis])), -1)
    want = {"SUM": flat.sum(1), "ASUM": numpy.abs(flat).sum(1), "SUMSQ": (flat ** 2).sum(1), "MEAN": flat.mean(1)}[op]
    assert top[0].shape == x.shape[:axis]
    numpy.testing.assert_allclose(host(top[0].data).reshape(-1), -1.5 * want)
    check_gradient(make("Reduction", reduction={"operation": op, "axis": axis, "coeff": -1.5}), [make_blob(x)], [Blob()])


def test_parameter_layer_is_a_learnable_top():
    net = Net({"name": "n", "force_backward": True, "layers": [
        {"name": "p", "type": "Parameter", "top": "w",
         "parameter": {"shape": {"dim": [2, 3]}, "filler": {"type": "constant", "value": 0.5}}},
        {"name": "loss", "type": "Reduction", "bottom": "w", "top": "loss", "loss_weight": 1,
         "reduction": {"operation": "SUMSQ"}}]}, dtype="float64")
    assert net.params["p"][0].shape == (2, 3) and net.num_learnable == 6
    net.forward()
    assert net.loss == pytest.approx(6 * 0.25)
    net.backward()
    numpy.testing.assert_allclose(net.params["p"][0].diff, 2 * 0.5)


def test_silence_zeroes_gradients_and_hides_outputs():
    net = Net({"name": "n", "force_backward": True, "layers": [
        {"name": "x", "type": "Input", "top": ["x", "y"], "input": {"shape": [[2, 3], [2]]}},
        {"name": "s", "type": "Silence", "bottom": ["x", "y"]}]}, dtype="float64")
    assert net.outputs == []
    net.blobs["x"].diff[...] = 7
    net.forward()
    net.backward()
    numpy.testing.assert_array_equal(net.blobs["x"].diff, 0)


# -- SPP ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pool", ["MAX", "AVE"])
@pytest.mark.parametrize("hw", [(5, 5), (13, 9), (1, 1), (8, 8)])
def test_spp_matches_caffes_pooling_per_level(pool, hw):
    from layerforge.layers.spp import SPP

    x = RS.randn(2, 3, *hw)
    layer = make("SPP", spp={"pyramid_height": 3, "pool": pool})
    _, top = forward(layer, [x])
    assert top[0].shape == (2, 3 * (1 + 4 + 16))
    parts = []
    for level in range(3):
        bins = 2 ** level
        kh, kw = math.ceil(hw[0] / bins), math.ceil(hw[1] / bins)
        ph, pw = (kh * bins - hw[0] + 1) // 2, (kw * bins - hw[1] + 1) // 2
        geometry = SPP.level_geometry(*hw, level)
        assert geometry == (kh, kw, kh, kw, ph, pw, bins, bins)
        pooled, _, _ = caffe_pooling(x, numpy.zeros((2, 3, bins, bins)), pool, *geometry[:6])
        parts.append(numpy.maximum(pooled, -FLT_MAX).reshape(2, -1))  # an empty MAX bin is -FLT_MAX in Caffe
    numpy.testing.assert_allclose(top[0].data, numpy.concatenate(parts, 1), rtol=1e-12)
    if (top[0].data > -1e38).all():  # no bin wholly in the padding (its -FLT_MAX swamps finite differences)
        check_gradient(make("SPP", spp={"pyramid_height": 3, "pool": pool}), [make_blob(x)], [Blob()], max_checks=40)


def test_plumbing_types_from_prototxt(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text("""name: "plumbing"
layer { name: "data" type: "Input" top: "data" top: "sel" top: "ref"
  input_param { shape { dim: 4 dim: 2 dim: 6 dim: 6 } shape { dim: 4 } shape { dim: 4 dim: 2 dim: 4 dim: 4 } } }
layer { name: "crop" type: "Crop" bottom: "data" bottom: "ref" top: "crop" crop_param { axis: 2 offset: 1 } }
layer { name: "bias" type: "Bias" bottom: "crop" top: "crop" }
layer { name: "mvn" type: "MVN" bottom: "crop" top: "mvn" }
layer { name: "tile" type: "Tile" bottom: "mvn" top: "tile" tile_param { axis: 1 tiles: 2 } }
layer { name: "spp" type: "SPP" bottom: "tile" top: "spp" spp_param { pyramid_height: 2 pool: AVE } }
layer { name: "filter" type: "Filter" bottom: "spp" bottom: "sel" top: "kept" }
layer { name: "argmax" type: "ArgMax" bottom: "kept" top: "best" argmax_param { top_k: 1 } }
layer { name: "sum" type: "Reduction" bottom: "kept" top: "total" reduction_param { operation: ASUM } }
layer { name: "silence" type: "Silence" bottom: "best" }
""")
    kind, mapping, _ = convert_file(path)
    assert kind == "net"
    types = [layer["type"] for layer in mapping["layers"]]
    assert types[1:] == ["Crop", "Bias", "MVN", "Tile", "SPP", "Filter", "ArgMax", "Reduction", "Silence"]
    assert mapping["layers"][1]["crop"] == {"axis": 2, "offset": 1}  # one repeated value: a scalar the schema takes
    net = Net(mapping, phase="test", dtype="float64")
    net.blobs["data"].data[...] = RS.randn(4, 2, 6, 6)
    net.blobs["sel"].data[...] = [1, 0, 1, 1]
    out = net.forward()
    assert net.blobs["spp"].shape == (4, 4 * 5)
    assert net.blobs["kept"].shape == (3, 20)
    assert set(out) == {"total"}
    assert float(out["total"]) == pytest.approx(numpy.abs(net.blobs["kept"].data).sum())
    net.backward()  # Reduction is no loss here: a zero top gradient reaches the learned bias as zero
    numpy.testing.assert_array_equal(net.params["bias"][0].diff, 0)


def test_v1_plumbing_types_from_prototxt(tmp_path):
    path = tmp_path / "v1.prototxt"
    path.write_text("""name: "v1" force_backward: true
input: "data" input_dim: 2 input_dim: 3 input_dim: 2 input_dim: 2
layers { name: "mvn" type: MVN bottom: "data" top: "mvn" mvn_param { across_channels: true } }
layers { name: "best" type: ARGMAX bottom: "mvn" top: "best" argmax_param { top_k: 2 out_max_val: true } }
layers { name: "loss" type: EUCLIDEAN_LOSS bottom: "mvn" bottom: "data" top: "loss" }
layers { name: "silence" type: SILENCE bottom: "best" }
""")
    net = Net(convert_file(path)[1], dtype="float64")
    x = RS.randn(2, 3, 2, 2)
    net.blobs["data"].data[...] = x
    net.forward()
    y = (x - x.mean(axis=(1, 2, 3), keepdims=True)) / (x.std(axis=(1, 2, 3), keepdims=True) + 1e-9)
    numpy.testing.assert_allclose(net.blobs["mvn"].data, y, rtol=1e-10)
    flat = y.reshape(2, -1)
    best = net.blobs["best"].data
    assert best.shape == (2, 2, 2, 1)  # Caffe keeps the bottom's rank: (N, 2, top_k, 1)
    best = best[..., 0]
    numpy.testing.assert_array_equal(best[:, 0, :], numpy.argsort(-flat, axis=1)[:, :2])
    numpy.testing.assert_allclose(best[:, 1, :], -numpy.sort(-flat, axis=1)[:, :2])
    net.backward()
    assert net.loss == pytest.approx(((y - x) ** 2).sum() / 4)
    numpy.testing.assert_allclose(net.blobs["mvn"].diff, (y - x) / 2)
    g = (y - x) / 2  # the data's gradient: the loss's direct -g plus MVN's backward of g (Caffe's formula)
    flat_g, std = g.reshape(2, -1), x.reshape(2, -1).std(axis=1, keepdims=True) + 1e-9
    through = (flat_g - flat_g.mean(1, keepdims=True) - flat * (flat_g * flat).mean(1, keepdims=True)) / std
    numpy.testing.assert_allclose(net.blobs["data"].diff, through.reshape(x.shape) - g, rtol=1e-8, atol=1e-12)
