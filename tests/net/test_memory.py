import numpy
import pytest

import layerforge
from layerforge import rng
from layerforge.blob import Blob
from layerforge.layers import create_layer
from layerforge.net.memory import memory_report

GAUSS = {"type": "gaussian", "std": 0.3}


def conv(name, bottom, top, n, k=3, **extra):
    return {"name": name, "type": "Convolution", "bottom": bottom, "top": top,
            "convolution": {"num_output": n, "kernel_size": k, "pad": k // 2, "weight_filler": GAUSS,
                            "bias_filler": GAUSS, **extra}}


def small_net(batch=4):
    """Conv / BN / Scale / ReLU in place, a residual Eltwise (a Split), pooling, LRN, dropout, two IPs."""
    layers = [
        {"name": "input", "type": "Input", "top": ["data", "label"], "input": {"shape": [[batch, 3, 8, 8], [batch]]}},
        conv("conv1", "data", "conv1", 6),
        {"name": "bn1", "type": "BatchNorm", "bottom": "conv1", "top": "conv1"},
        {"name": "sc1", "type": "Scale", "bottom": "conv1", "top": "conv1", "scale": {"bias_term": True}},
        {"name": "relu1", "type": "ReLU", "bottom": "conv1", "top": "conv1"},
        conv("conv2", "conv1", "conv2", 6),
        {"name": "sum", "type": "Eltwise", "bottom": ["conv1", "conv2"], "top": "sum"},
        {"name": "pool", "type": "Pooling", "bottom": "sum", "top": "pool", "pooling": {"kernel_size": 2, "stride": 2}},
        {"name": "norm", "type": "LRN", "bottom": "pool", "top": "norm", "lrn": {"local_size": 3}},
        {"name": "tanh", "type": "TanH", "bottom": "norm", "top": "tanh"},
        {"name": "ip1", "type": "InnerProduct", "bottom": "tanh", "top": "ip1",
         "inner_product": {"num_output": 10, "weight_filler": GAUSS}},
        {"name": "drop", "type": "Dropout", "bottom": "ip1", "top": "ip1"},
        {"name": "ip2", "type": "InnerProduct", "bottom": "ip1", "top": "ip2",
         "inner_product": {"num_output": 5, "weight_filler": GAUSS}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip2", "label"], "top": "loss"},
    ]
    return {"name": "small", "force_backward": True, "layers": layers}


def iterate(net, feeds):
    out = []
    for seed, feed in enumerate(feeds):
        rng.seed(seed)  # dropout masks
        net.clear_param_diffs()
        net.forward(**feed)
        grads = net.backward()
        out.append((net.loss, {k: v.copy() for k, v in grads.items()},
                    [b.diff.copy() for b in net.learnable_params]))
    return out


def feeds(batch=4, count=2):
    g = numpy.random.default_rng(0)
    return [{"data": g.standard_normal((batch, 3, 8, 8)), "label": g.integers(0, 5, batch).astype(float)}
            for _ in range(count)]


def twin_nets(batch=4):
    a = layerforge.Net(small_net(batch), dtype="float64")
    b = layerforge.Net(small_net(batch), dtype="float64")
    b.copy_from(a.state_arrays())
    b.optimize_memory()
    return a, b


def assert_same(run_a, run_b, rtol=0.0):
    """The same losses and gradients; to ``rtol`` of the largest gradient where the planned net's Split sums are its
    consumers' (the sum of conv2's and the Eltwise's gradients in another order: conv1's bias gradient, zero but for
    rounding under BatchNorm, then differs in every bit)."""
    for (la, ga, pa), (lb, gb, pb) in zip(run_a, run_b):
        assert la == lb
        pairs = [(ga[k], gb[k]) for k in ga] + list(zip(pa, pb))
        scale = max(numpy.abs(x).max() for x, _ in pairs)
        for x, y in pairs:
            numpy.testing.assert_allclose(x, y, rtol=0, atol=rtol * scale)


SUM_ORDER = 1e-13  # float64's rounding of a sum in another order, with a margin


def test_planned_net_computes_what_the_plain_net_does():
    a, b = twin_nets()
    f = feeds()
    assert_same(iterate(a, f), iterate(b, f), SUM_ORDER)
    assert_same(iterate(a, f), iterate(b, f), SUM_ORDER)
    assert list(b._split_sums.values()) == [[(b._layer_index["sum"], 0), (b._layer_index["conv2"], 0)]]


def test_planned_net_without_split_sums_computes_the_same_bits():
    a, b = twin_nets()
    b.optimize_memory(False)
    b.layers[b._layer_index["conv2"]].adds_bottom_diffs = False  # (an instance's: conv2 cannot make the sum)
    b.optimize_memory()
    assert b._split_sums == {}
    f = feeds()
    assert_same(iterate(a, f), iterate(b, f))


def test_planning_shares_storage_and_reports_bytes():
    a, b = twin_nets()
    plain, planned = memory_report(a), memory_report(b)
    assert plain["activation_bytes"] == plain["unplanned_activation_bytes"]
    assert planned["unplanned_activation_bytes"] == plain["unplanned_activation_bytes"]
    assert planned["activation_bytes"] < 0.8 * plain["activation_bytes"]
    assert planned["param_bytes"] == plain["param_bytes"] > 0
    assert planned["peak_bytes"] == planned["activation_bytes"] + planned["param_bytes"] + planned["layer_bytes"]
    assert planned["layer_bytes"] == planned["cache_bytes"] + planned["workspace_bytes"] > 0
    # the convolution output read only by the in-place BN (which keeps its own copy) is given back
    assert b.blobs["pool"].data.base is not None


def test_a_planned_test_net_gives_the_same_outputs_in_less_storage():
    """A TEST net (forward only: BatchNorm's stored statistics, Dropout passing input through, an Accuracy) planned
    as layerforge train plans its test nets (Solver.share_activations): the same outputs, bit for bit, over two
    batches, in less storage."""
    spec = small_net()
    spec["force_backward"] = False
    spec["layers"].append({"name": "accuracy", "type": "Accuracy", "bottom": ["ip2", "label"], "top": "accuracy"})
    a = layerforge.Net(spec, phase="TEST", dtype="float64")
    g = numpy.random.default_rng(5)
    mean, var, factor = a.layer_dict["bn1"].blobs
    mean.data[...], var.data[...], factor.data[...] = g.standard_normal(6), g.uniform(0.5, 2.0, 6), 1.0
    b = layerforge.Net(spec, phase="TEST", dtype="float64")
    b.copy_from(a.state_arrays())
    b.optimize_memory()
    for f in feeds():
        got, want = b.forward(**f), a.forward(**f)
        assert sorted(got) == ["accuracy", "loss"]
        for k in want:
            assert got[k].tobytes() == want[k].tobytes() and numpy.isfinite(want[k]).all(), k
    assert memory_report(b)["activation_bytes"] < 0.8 * memory_report(a)["activation_bytes"]


def filter_net():
    """A Filter's top changes size with the selector's values, in the middle of a pass; ``early`` (computed before the
    Filter) is read after it."""
    ip = {"num_output": 5, "weight_filler": GAUSS, "bias_filler": GAUSS}
    layers = [
        {"name": "input", "type": "Input", "top": ["x", "sel"], "input": {"shape": [[6, 3], [6]]}},
        {"name": "ip1", "type": "InnerProduct", "bottom": "x", "top": "ip1", "inner_product": ip},
        {"name": "tanh", "type": "TanH", "bottom": "ip1", "top": "tanh"},
        {"name": "early", "type": "Reduction", "bottom": "tanh", "top": "early", "reduction": {"operation": "SUMSQ"}},
        {"name": "filter", "type": "Filter", "bottom": ["tanh", "sel"], "top": "kept"},
        {"name": "ip2", "type": "InnerProduct", "bottom": "kept", "top": "ip2", "inner_product": ip},
        {"name": "late", "type": "Reduction", "bottom": "ip2", "top": "late", "reduction": {"operation": "SUMSQ"}},
        {"name": "total", "type": "Eltwise", "bottom": ["early", "late"], "top": "total", "loss_weight": 1},
    ]
    return {"name": "filter", "force_backward": True, "layers": layers}


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_a_top_that_changes_size_in_a_pass_keeps_what_came_before(phase):
    """A Filter's top changes size with the selector, so the net plans its storage again in the middle of the pass
    (as an SSD net's detection output does): the values computed before it that later layers read (``early``) come
    along into the new storage. The same outputs and gradients as the plain net's, pass after pass."""
    a = layerforge.Net(filter_net(), phase=phase, dtype="float64")
    b = layerforge.Net(filter_net(), phase=phase, dtype="float64")
    b.copy_from(a.state_arrays())
    b.optimize_memory()
    g = numpy.random.default_rng(2)
    for sel in ([1, 0, 1, 0, 0, 0], [1, 1, 0, 1, 1, 0], [0, 1, 0, 0, 0, 0]):  # 2, 4, then 1 items kept
        feed = {"x": g.standard_normal((6, 3)), "sel": numpy.array(sel, dtype=float)}
        for net in (a, b):
            net.clear_param_diffs()
            net.forward(**feed)
            if phase == "TRAIN":
                net.backward()
        assert b.blobs["total"].data.tobytes() == a.blobs["total"].data.tobytes()
        assert float(a.blobs["early"].data) > 0
        for pa, pb in zip(a.learnable_params, b.learnable_params):
            assert pb.diff.tobytes() == pa.diff.tobytes()


def test_inputs_and_outputs_stay_readable():
    a, b = twin_nets()
    f = feeds(count=1)[0]
    out = b.forward(**f)
    b.backward()
    numpy.testing.assert_array_equal(b.blobs["data"].data, f["data"])
    assert out["loss"] == b.loss == pytest.approx(float(b.blobs["loss"].data))


def test_reshape_replans_and_optimize_memory_can_be_undone():
    a, b = twin_nets()
    f = feeds(batch=6)
    assert_same(iterate(a, f), iterate(b, f), SUM_ORDER)  # set_inputs reshapes both nets to batch 6
    b.optimize_memory(False)
    assert memory_report(b)["activation_bytes"] == memory_report(b)["unplanned_activation_bytes"]
    assert b._split_sums == {} and not any(layer.bottom_diffs_added for layer in b.layers)
    assert_same(iterate(a, f), iterate(b, f))


LAYERS = [  # (layer dict, bottom shapes); non in-place, so backward_reads can be checked one blob at a time
    ({"type": "Convolution", "convolution": {"num_output": 3, "kernel_size": 3, "weight_filler": GAUSS}}, [(2, 2, 5, 5)]),
    ({"type": "Pooling", "pooling": {"kernel_size": 2, "stride": 2}}, [(2, 2, 4, 4)]),
    ({"type": "Pooling", "pooling": {"kernel_size": 3, "stride": 2, "pool": "AVE"}}, [(2, 2, 5, 5)]),
    ({"type": "LRN", "lrn": {"local_size": 3}}, [(2, 4, 3, 3)]),
    ({"type": "BatchNorm"}, [(4, 3, 2, 2)]),
    ({"type": "ReLU"}, [(2, 5)]),
    ({"type": "Sigmoid"}, [(2, 5)]),
    ({"type": "TanH"}, [(2, 5)]),
    ({"type": "ELU"}, [(2, 5)]),
    ({"type": "PReLU"}, [(2, 3, 2)]),
    ({"type": "Scale", "scale": {"bias_term": True}}, [(2, 3, 2)]),
    ({"type": "Eltwise", "eltwise": {"operation": "SUM"}}, [(2, 3), (2, 3)]),
    ({"type": "Eltwise", "eltwise": {"operation": "MAX"}}, [(2, 3), (2, 3)]),
    ({"type": "Eltwise", "eltwise": {"operation": "PROD"}}, [(2, 3), (2, 3)]),
    ({"type": "InnerProduct", "inner_product": {"num_output": 4, "weight_filler": GAUSS}}, [(3, 5)]),
]


def backward_after(layer_dict, shapes, spoil):
    g = numpy.random.default_rng(1)
    rng.seed(0)  # fillers
    layer = create_layer(layer_dict, dtype=numpy.float64)
    bottom = [Blob(s, numpy.float64) for s in shapes]
    for b in bottom:
        b.data[...] = g.standard_normal(b.shape)
    top = [Blob((), numpy.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = g.standard_normal(top[0].shape)
    for blob in {"bottom": bottom, "top": top}.get(spoil, []):
        blob.data[...] = numpy.nan  # what the planner may do to storage nobody declared
    layer.backward(top, [True] * len(bottom), bottom)
    return [b.diff.copy() for b in bottom] + [p.diff.copy() for p in layer.blobs], layer.backward_reads


@pytest.mark.parametrize("layer_dict, shapes", LAYERS)
def test_backward_reads_only_what_it_declares(layer_dict, shapes):
    expected, reads = backward_after(layer_dict, shapes, None)
    for side in ("bottom", "top"):
        if side in reads:
            continue
        got, _ = backward_after(layer_dict, shapes, side)
        for a, e in zip(got, expected):
            numpy.testing.assert_array_equal(a, e, err_msg=f"backward reads its {side} but does not declare it")


def bottleneck_net(engine, batch=2):
    """Two ResNet blocks: a projection shortcut (branch1 and branch2a read one Split's tops) and an identity one
    (branch2a and the Eltwise + ReLU join read them), 1x1 and 3x3 convolutions on ``engine``."""
    def c(name, bottom, n, k=1, stride=1):
        return {"name": name, "type": "Convolution", "bottom": bottom, "top": name,
                "convolution": {"num_output": n, "kernel_size": k, "pad": k // 2, "stride": stride,
                                "weight_filler": GAUSS, "bias_term": False, "engine": engine}}

    def bn_relu(blob, relu=True):
        return ([{"name": f"{blob}_bn", "type": "BatchNorm", "bottom": blob, "top": blob},
                 {"name": f"{blob}_sc", "type": "Scale", "bottom": blob, "top": blob, "scale": {"bias_term": True}}]
                + ([{"name": f"{blob}_relu", "type": "ReLU", "bottom": blob, "top": blob}] if relu else []))

    def block(name, bottom, width, project):
        layers = [c(f"{name}_1", bottom, 4 * width)] + bn_relu(f"{name}_1", False) if project else []
        layers += [c(f"{name}_2a", bottom, width)] + bn_relu(f"{name}_2a")
        layers += [c(f"{name}_2b", f"{name}_2a", width, k=3)] + bn_relu(f"{name}_2b")
        layers += [c(f"{name}_2c", f"{name}_2b", 4 * width)] + bn_relu(f"{name}_2c", False)
        layers += [{"name": name, "type": "Eltwise", "bottom": [f"{name}_1" if project else bottom, f"{name}_2c"],
                    "top": name},
                   {"name": f"{name}_relu", "type": "ReLU", "bottom": name, "top": name}]
        return layers
    layers = [{"name": "input", "type": "Input", "top": ["data", "label"],
               "input": {"shape": [[batch, 8, 6, 6], [batch]]}}]
    layers += block("a", "data", 4, True) + block("b", "a", 4, False)
    layers += [{"name": "ip", "type": "InnerProduct", "bottom": "b", "top": "ip",
                "inner_product": {"num_output": 3, "weight_filler": GAUSS}},
               {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]
    return {"name": "bottleneck", "force_backward": True, "layers": layers}


@pytest.mark.parametrize("engine", ["IMPLICIT", "IM2COL", "AUTO"])
def test_splits_are_summed_by_their_consumers(monkeypatch, engine):
    """Under optimize_memory, the Splits of both shortcuts leave their sums to their consumers: the tops share the
    bottom's diff, the first consumer backward meets writes it, the convolution after it adds to it, and the Split's
    own backward does not run; the gradients are the plain net's to float32 rounding."""
    from layerforge.layers.concat import Split
    a = layerforge.Net(bottleneck_net(engine))
    b = layerforge.Net(bottleneck_net(engine))
    b.copy_from(a.state_arrays())
    b.optimize_memory()
    index = b._layer_index
    assert sorted(b._split_sums.values()) == sorted([
        [(index["a_2a"], 0), (index["a_1"], 0)],  # backward meets branch2a first: it writes, branch1 adds
        [(index["b"], 0), (index["b_2a"], 0)]])  # the join (at its ReLU) writes, branch2a adds
    for i in b._split_sums:
        bottom = b.bottom_blobs(i)[0]
        assert all(t.diff is bottom.diff for t in b.top_blobs(i))
    assert b.layers[index["a_1"]].bottom_diffs_added == {0} and b.layers[index["a_2a"]].bottom_diffs_added == set()
    monkeypatch.setattr(Split, "backward", lambda *args: pytest.fail("a summed Split ran its backward"))
    f = [{"data": numpy.random.default_rng(k).standard_normal((2, 8, 6, 6)), "label": numpy.array([0.0, 2.0])}
         for k in range(2)]
    monkeypatch.undo()
    plain = iterate(a, f)
    monkeypatch.setattr(Split, "backward", lambda *args: pytest.fail("a summed Split ran its backward"))
    planned = iterate(b, f)
    for (la, ga, pa), (lb, gb, pb) in zip(plain, planned):
        assert la == pytest.approx(lb, rel=1e-6)
        for x, y in [(ga["data"], gb["data"])] + list(zip(pa, pb)):
            numpy.testing.assert_allclose(y, x, rtol=0, atol=2e-5 * numpy.abs(x).max())
