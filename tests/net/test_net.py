import numpy
import pytest

import layerforge
from layerforge import rng
from layerforge.errors import LayerforgeError


def mlp(extra_layers=(), force_backward=False, **ip1):
    layers = [
        {"name": "input", "type": "Input", "top": ["data", "label"], "input": {"shape": [[4, 3], [4]]}},
        {"name": "ip1", "type": "InnerProduct", "bottom": "data", "top": "ip1",
         "inner_product": {"num_output": 5, "weight_filler": {"type": "gaussian", "std": 0.5},
                           "bias_filler": {"type": "uniform", "min": -0.5, "max": 0.5}, **ip1}},
        {"name": "relu1", "type": "ReLU", "bottom": "ip1", "top": "ip1"},
        {"name": "ip2", "type": "InnerProduct", "bottom": "ip1", "top": "ip2",
         "inner_product": {"num_output": 3, "weight_filler": {"type": "gaussian", "std": 0.5}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip2", "label"], "top": "loss"},
    ]
    return {"name": "mlp", "force_backward": force_backward, "layers": layers + list(extra_layers)}


def inputs(seed=0):
    g = numpy.random.default_rng(seed)
    return {"data": g.standard_normal((4, 3)), "label": numpy.array([0, 2, 1, 2], dtype=float)}


def numeric_param_grad(net, blob, feed, h=1e-5):
    grad = numpy.zeros_like(blob.data)
    flat, g = blob.data.reshape(-1), grad.reshape(-1)
    for k in range(flat.size):
        x = flat[k]
        flat[k] = x + h
        net.forward(**feed)
        plus = net.loss
        flat[k] = x - h
        net.forward(**feed)
        minus = net.loss
        flat[k] = x
        g[k] = (plus - minus) / (2 * h)
    return grad


def test_mlp_forward_matches_numpy():
    net = layerforge.Net(mlp(), dtype="float64")
    feed = inputs()
    out = net.forward(**feed)
    W1, b1 = net.params["ip1"][0].data, net.params["ip1"][1].data
    W2, b2 = net.params["ip2"][0].data, net.params["ip2"][1].data
    h = numpy.maximum(feed["data"] @ W1.T + b1, 0)
    z = h @ W2.T + b2
    p = numpy.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    expected = -numpy.log(p[numpy.arange(4), feed["label"].astype(int)]).mean()
    assert out["loss"] == pytest.approx(expected, rel=1e-12)
    assert net.loss == pytest.approx(expected, rel=1e-12)
    assert list(out) == ["loss"]
    assert net.inputs == ["data", "label"]


def test_in_place_layer_shares_storage():
    net = layerforge.Net(mlp(), dtype="float64")
    net.forward(**inputs())
    relu = net.layer_dict["relu1"]
    i = net.layers.index(relu)
    assert net.bottom_blobs(i)[0] is net.top_blobs(i)[0] is net.blobs["ip1"]
    assert (net.blobs["ip1"].data >= 0).all()


def test_backward_matches_finite_differences_for_every_param():
    net = layerforge.Net(mlp(), dtype="float64")
    feed = inputs()
    net.forward(**feed)
    net.clear_param_diffs()
    net.backward()
    for name, blobs in net.params.items():
        for j, blob in enumerate(blobs):
            analytic = blob.diff.copy()
            numpy.testing.assert_allclose(analytic, numeric_param_grad(net, blob, feed), rtol=1e-5, atol=1e-8,
                                          err_msg=f"{name}/{j}")


def test_split_inserted_and_diffs_summed():
    definition = {"name": "split", "force_backward": True, "layers": [
        {"name": "input", "type": "Input", "top": "x", "input": {"shape": [2, 3]}},
        {"name": "a", "type": "InnerProduct", "bottom": "x", "top": "a",
         "inner_product": {"num_output": 2, "weight_filler": {"type": "gaussian"}}},
        {"name": "b", "type": "InnerProduct", "bottom": "x", "top": "b",
         "inner_product": {"num_output": 2, "weight_filler": {"type": "gaussian"}}},
        {"name": "sum", "type": "Eltwise", "bottom": ["a", "b"], "top": "s"},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["s", "a"], "top": "loss"},
    ]}
    net = layerforge.Net(definition, dtype="float64")
    types = [layer.type for layer in net.layers]
    assert types.count("Split") == 2  # x feeds a and b; a feeds sum and loss
    assert "x_input_0_split" in net.layer_dict
    assert "x_input_0_split_0" in net.blobs and "x_input_0_split_1" in net.blobs
    x = numpy.random.default_rng(3).standard_normal((2, 3))
    net.forward(x=x)
    grads = net.backward()
    # d loss / d x by central differences on the input
    num = numpy.zeros_like(x)
    for idx in numpy.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += 1e-6
        xm[idx] -= 1e-6
        plus = float(net.forward(x=xp)["loss"])
        num[idx] = (plus - float(net.forward(x=xm)["loss"])) / 2e-6
    numpy.testing.assert_allclose(grads["x"], num, rtol=1e-5, atol=1e-9)


def test_parameter_sharing_by_name():
    definition = {"layers": [
        {"name": "input", "type": "Input", "top": ["x", "y"], "input": {"shape": [[2, 3], [2, 3]]}},
        {"name": "fx", "type": "InnerProduct", "bottom": "x", "top": "fx", "param": [{"name": "W"}, {"name": "b"}],
         "inner_product": {"num_output": 3, "weight_filler": {"type": "gaussian"}}},
        {"name": "fy", "type": "InnerProduct", "bottom": "y", "top": "fy", "param": [{"name": "W"}, {"name": "b"}],
         "inner_product": {"num_output": 3, "weight_filler": {"type": "gaussian"}}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["fx", "fy"], "top": "loss"},
    ]}
    net = layerforge.Net(definition, dtype="float64")
    assert net.params["fx"][0] is net.params["fy"][0]
    assert len(net.learnable_params) == 2
    assert net.num_learnable == 3 * 3 + 3
    g = numpy.random.default_rng(1)
    feed = {"x": g.standard_normal((2, 3)), "y": g.standard_normal((2, 3))}
    net.forward(**feed)
    net.clear_param_diffs()
    net.backward()
    W = net.params["fx"][0]
    numpy.testing.assert_allclose(W.diff, numeric_param_grad(net, W, feed), rtol=1e-5, atol=1e-9)


def test_sharing_with_mismatched_shape_is_an_error():
    definition = {"layers": [
        {"name": "input", "type": "Input", "top": "x", "input": {"shape": [2, 3]}},
        {"name": "f1", "type": "InnerProduct", "bottom": "x", "top": "f1", "param": [{"name": "W"}],
         "inner_product": {"num_output": 3}},
        {"name": "f2", "type": "InnerProduct", "bottom": "f1", "top": "f2", "param": [{"name": "W"}],
         "inner_product": {"num_output": 4}},
    ]}
    with pytest.raises(LayerforgeError, match=r"layer 'f2' \(InnerProduct\): key 'param': shared parameter 'W' "
                                              r"has shape \(4, 3\) here but \(3, 3\) in layer 'f1'"):
        layerforge.Net(definition)


@pytest.mark.parametrize("phase,expected", [("train", ["input", "drop", "ip"]), ("test", ["input", "ip", "acc"])])
def test_phase_filtering(phase, expected):
    definition = {"layers": [
        {"name": "input", "type": "Input", "top": ["x", "label"], "input": {"shape": [[2, 3], [2]]}},
        {"name": "drop", "type": "Dropout", "bottom": "x", "top": "x", "include": {"phase": "TRAIN"}},
        {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "ip", "inner_product": {"num_output": 2}},
        {"name": "acc", "type": "Accuracy", "bottom": ["ip", "label"], "top": "acc", "include": [{"phase": "TEST"}]},
    ]}
    net = layerforge.Net(definition, phase=phase)
    assert [layer.name for layer in net.layers] == expected


def test_stage_rules():
    definition = {"layers": [
        {"name": "input", "type": "Input", "top": "x", "input": {"shape": [2, 3]}},
        {"name": "deploy_only", "type": "ReLU", "bottom": "x", "top": "x", "include": {"stage": "deploy"}},
        {"name": "not_deploy", "type": "TanH", "bottom": "x", "top": "x", "exclude": {"stage": "deploy"}},
    ]}
    assert [la.name for la in layerforge.Net(definition, stages=["deploy"]).layers] == ["input", "deploy_only"]
    assert [la.name for la in layerforge.Net(definition).layers] == ["input", "not_deploy"]


def test_loss_weight_scales_loss_and_gradients():
    base = layerforge.Net(mlp(), dtype="float64")
    rng.seed(1234)
    weighted_def = mlp()
    weighted_def["layers"][-1]["loss_weight"] = 2.5
    weighted = layerforge.Net(weighted_def, dtype="float64")
    feed = inputs()
    for net in (base, weighted):
        net.forward(**feed)
        net.clear_param_diffs()
        net.backward()
    assert weighted.loss == pytest.approx(2.5 * base.loss, rel=1e-12)
    numpy.testing.assert_allclose(weighted.params["ip1"][0].diff, 2.5 * base.params["ip1"][0].diff, rtol=1e-12)


def test_two_losses_sum_with_weights():
    extra = [{"name": "l2", "type": "EuclideanLoss", "bottom": ["ip2", "ip2b"], "top": "l2", "loss_weight": 0.5},
             {"name": "ip2b", "type": "InnerProduct", "bottom": "data", "top": "ip2b",
              "inner_product": {"num_output": 3, "weight_filler": {"type": "gaussian"}}}]
    net = layerforge.Net(mlp(extra), dtype="float64")
    out = net.forward(**inputs())
    assert net.loss == pytest.approx(out["loss"] + 0.5 * out["l2"], rel=1e-12)


def test_propagate_down_false_stops_gradient():
    definition = mlp()
    definition["layers"][3]["propagate_down"] = [False]  # ip2 does not send a gradient to ip1
    net = layerforge.Net(definition, dtype="float64")
    names = [la.name for la in net.layers]
    assert not net.layer_need_backward[names.index("ip1")]
    assert not net.layer_need_backward[names.index("relu1")]
    assert net.layer_need_backward[names.index("ip2")]
    net.forward(**inputs())
    net.clear_param_diffs()
    net.backward()
    assert not net.params["ip1"][0].diff.any()
    assert net.params["ip2"][0].diff.any()


def test_lr_mult_zero_everywhere_skips_backward():
    definition = mlp()
    definition["layers"][1]["param"] = [{"lr_mult": 0}, {"lr_mult": 0}]
    net = layerforge.Net(definition)
    names = [la.name for la in net.layers]
    assert not net.layer_need_backward[names.index("ip1")]
    assert net.params_lr[:2] == [0.0, 0.0]
    assert net.layer_need_backward[names.index("ip2")]


def test_force_backward_gives_input_diffs():
    net = layerforge.Net(mlp(force_backward=True), dtype="float64")
    net.forward(**inputs())
    diffs = net.backward()
    assert diffs["data"].shape == (4, 3) and numpy.abs(diffs["data"]).sum() > 0
    assert not diffs["label"].any()  # the label of a loss never takes a gradient


def test_reshape_on_new_input_shape():
    net = layerforge.Net(mlp(), dtype="float64")
    g = numpy.random.default_rng(0)
    out = net.forward(data=g.standard_normal((7, 3)), label=g.integers(0, 3, 7).astype(float))
    assert net.blobs["ip2"].shape == (7, 3)
    assert numpy.isfinite(out["loss"])


def test_save_load_and_copy_from(tmp_path):
    net = layerforge.Net(mlp(), dtype="float64")
    path = tmp_path / "w.npz"
    net.save(path)
    rng.seed(99)
    other = layerforge.Net(mlp(), dtype="float64")
    assert not numpy.array_equal(other.params["ip1"][0].data, net.params["ip1"][0].data)
    other.load(path)
    for name in net.params:
        for a, b in zip(net.params[name], other.params[name]):
            numpy.testing.assert_array_equal(a.data, b.data)
    # copy_from matches by layer name and keeps layers the file lacks
    renamed = mlp()
    renamed["layers"][3]["name"] = "ip2_new"
    rng.seed(5)
    fine = layerforge.Net(renamed, dtype="float64")
    before = fine.params["ip2_new"][0].data.copy()
    fine.copy_from(path)
    numpy.testing.assert_array_equal(fine.params["ip1"][0].data, net.params["ip1"][0].data)
    numpy.testing.assert_array_equal(fine.params["ip2_new"][0].data, before)


def test_load_rejects_wrong_shapes_and_missing_layers(tmp_path):
    net = layerforge.Net(mlp())
    path = tmp_path / "w.npz"
    net.save(path)
    bigger = layerforge.Net(mlp(num_output=6))
    with pytest.raises(LayerforgeError, match=r"layer 'ip1' parameter 0 has shape \(5, 3\) in the file but \(6, 3\)"):
        bigger.load(path)
    numpy.savez(tmp_path / "partial.npz", **{"ip1/0": net.params["ip1"][0].data})
    with pytest.raises(LayerforgeError, match="has no weights for ip1/1"):
        net.load(tmp_path / "partial.npz")


def test_forward_unknown_input_is_an_error():
    net = layerforge.Net(mlp())
    with pytest.raises(LayerforgeError, match="'ip1' is not an input of net 'mlp'"):
        net.forward(ip1=numpy.zeros((4, 5)))


def test_fully_connected_weight_gradients_are_written_whole_not_cleared_first():
    """clear_param_diffs defers the zeros of InnerProduct's weight diffs (their backward writes them whole with
    one GEMM): after a stale value, one pass gives the pass's gradient, two passes the sum, a read before any
    backward gives zeros; a weight two layers share, and a frozen layer's (no backward), are cleared at once."""
    net = layerforge.Net(mlp(), dtype="float64")
    w1, w2 = net.layer_dict["ip1"].blobs[0], net.layer_dict["ip2"].blobs[0]
    assert net._overwritten_diffs == {id(w1), id(w2)}
    feed = inputs()
    net.forward(**feed)
    net.backward()
    once = [w1.diff.copy(), w2.diff.copy(), net.layer_dict["ip1"].blobs[1].diff.copy()]
    for w in (w1, w2):
        w.diff[...] = 7.0  # the last iteration's gradient
    net.clear_param_diffs()
    numpy.testing.assert_array_equal(w1.diff, 0)  # read before backward: the deferred zeros
    w1.diff[...] = 7.0
    net.clear_param_diffs()
    for k in range(2):  # iter_size 2: the first pass writes, the second adds
        net.forward(**feed)
        net.backward()
        numpy.testing.assert_allclose(w1.diff, (k + 1) * once[0], rtol=1e-12)
        numpy.testing.assert_allclose(w2.diff, (k + 1) * once[1], rtol=1e-12)
        numpy.testing.assert_allclose(net.layer_dict["ip1"].blobs[1].diff, (k + 1) * once[2], rtol=1e-12)

    shared = mlp([{"name": "ip3", "type": "InnerProduct", "bottom": "data", "top": "ip3",
                   "param": [{"name": "w1"}, {"name": "b1"}], "inner_product": {"num_output": 5}},
                  {"name": "silence", "type": "Silence", "bottom": "ip3"}])
    shared["layers"][1]["param"] = [{"name": "w1"}, {"name": "b1"}]
    net = layerforge.Net(shared, dtype="float64")
    assert id(net.layer_dict["ip1"].blobs[0]) not in net._overwritten_diffs
    frozen = mlp()
    frozen["layers"][1]["param"] = [{"lr_mult": 0}, {"lr_mult": 0}]  # ip1 needs no backward: nothing below learns
    net = layerforge.Net(frozen, dtype="float64")
    assert id(net.layer_dict["ip1"].blobs[0]) not in net._overwritten_diffs
    assert id(net.layer_dict["ip2"].blobs[0]) in net._overwritten_diffs
