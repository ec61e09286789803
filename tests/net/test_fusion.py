"""Fused BatchNorm + Scale (+ ReLU) (layerforge.net.fusion): the same values as the three layers run one by one, in
both phases; the parameters stay where the layers keep them; one activation-sized array fewer is kept."""
import numpy
import pytest
import torch

from layerforge import Net
from layerforge.backend import to_numpy
from layerforge.solvers import get_solver


def group_net(shape, relu=True, slope=0.0, fuse=True, global_stats=None, scale_lr=1.0, force_backward=True):
    """Input x (and a target) -> Power -> BatchNorm -> Scale -> [ReLU], all in place on 'h' -> EuclideanLoss."""
    bn = {"name": "bn", "type": "BatchNorm", "bottom": "h", "top": "h",
          "batch_norm": {"moving_average_fraction": 0.9, "eps": 1e-3}}
    if global_stats is not None:
        bn["batch_norm"]["use_global_stats"] = global_stats
    layers = [
        {"name": "input", "type": "Input", "top": ["x", "target"], "input": {"shape": [list(shape), list(shape)]}},
        {"name": "power", "type": "Power", "bottom": "x", "top": "h", "power": {"scale": 1.5, "shift": 0.25}}, bn,
        {"name": "scale", "type": "Scale", "bottom": "h", "top": "h", "param": [{"lr_mult": scale_lr}, {}],
         "scale": {"bias_term": True, "filler": {"type": "uniform", "min": 0.5, "max": 2},
                   "bias_filler": {"type": "uniform", "min": -1, "max": 1}}}]
    if relu:
        layers.append({"name": "relu", "type": "ReLU", "bottom": "h", "top": "h", "relu": {"negative_slope": slope}})
    layers.append({"name": "loss", "type": "EuclideanLoss", "bottom": ["h", "target"], "top": "loss"})
    return {"name": "g", "force_backward": force_backward, "fuse_batch_norm": fuse, "layers": layers}


def run(definition, phase, x, target, passes=2):
    """Build the net with seeded fillers, run ``passes`` forward + backward passes; return the net."""
    from layerforge import rng
    rng.seed(7)
    net = Net(definition, phase=phase, dtype="float64")
    if net.layer_dict["bn"].use_global_stats:  # running statistics to normalise with
        c = x.shape[1] if x.ndim > 1 else 1
        stats = net.params["bn"]
        stats[0].data[...] = numpy.linspace(-1, 2, c) * 1.7
        stats[1].data[...] = numpy.linspace(0.5, 3, c) * 1.7
        stats[2].data[...] = 1.7
    for _ in range(passes):
        net.clear_param_diffs()
        net.forward(x=x, target=target)
        net.backward()
    return net


SHAPES = [(4, 3, 5, 6), (2, 5, 3), (8, 4), (3, 2, 1, 7)]


def arrays(net):
    return {"h": net.blobs["h"].data, "gh": net.blobs["h"].diff, "gx": net.blobs["x"].diff,
            **{f"{name}/{j}/{kind}": getattr(b, kind) for name, blobs in net.params.items()
               for j, b in enumerate(blobs) for kind in ("data", "diff")}}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("relu,slope", [(True, 0.0), (True, 0.1), (False, None)])
@pytest.mark.parametrize("phase,global_stats", [("TRAIN", None), ("TEST", None), ("TRAIN", True), ("TEST", False)])
def test_fused_equals_the_layers_one_by_one(shape, relu, slope, phase, global_stats):
    r = numpy.random.default_rng(3)
    x, target = r.standard_normal(shape) * 2 + 0.5, r.standard_normal(shape)
    fused = run(group_net(shape, relu, slope or 0.0, True, global_stats), phase, x, target)
    plain = run(group_net(shape, relu, slope or 0.0, False, global_stats), phase, x, target)
    assert set(fused._fused) == ({2, 3, 4} if relu else {2, 3}) and plain._fused == {}
    for key, a in arrays(plain).items():
        numpy.testing.assert_allclose(arrays(fused)[key], a, rtol=1e-10, atol=1e-12, err_msg=key)
    assert abs(fused.loss - plain.loss) <= 1e-10 * max(1.0, abs(plain.loss))
    # the moving averages moved (batch statistics) or held (global statistics): identical either way
    moved = not fused.layer_dict["bn"].use_global_stats
    assert (fused.params["bn"][2].data[0] != 1.7) == moved


def test_a_later_layer_in_place_on_the_blob_makes_backward_read_its_mask_from_the_blob():
    # Caffe's ReLU backward reads its top as backward finds it: here a Power in place after the ReLU has negated it,
    # so the group must read the blob rather than recompute forward's mask from x_norm
    shape, r = (4, 3, 5, 2), numpy.random.default_rng(6)
    x, target = r.standard_normal(shape) * 2 + 0.5, r.standard_normal(shape)
    nets = {}
    for fuse in (True, False):
        definition = group_net(shape, fuse=fuse)
        definition["layers"].insert(5, {"name": "negate", "type": "Power", "bottom": "h", "top": "h",
                                        "power": {"scale": -1.0}})
        nets[fuse] = run(definition, "TRAIN", x, target)
    assert not nets[True]._fused[2].output_kept
    assert run(group_net(shape), "TRAIN", x, target)._fused[2].output_kept
    for key, a in arrays(nets[False]).items():
        numpy.testing.assert_allclose(arrays(nets[True])[key], a, rtol=1e-10, atol=1e-12, err_msg=key)
    assert not nets[True].blobs["x"].diff.any()  # the negated output is <= 0 everywhere: the mask stops it all


def test_a_frozen_scale_keeps_its_diffs_and_a_negative_slope_is_not_fused():
    shape, r = (4, 3, 2, 2), numpy.random.default_rng(4)
    x, target = r.standard_normal(shape), r.standard_normal(shape)
    fused = run(group_net(shape, scale_lr=0.0, force_backward=False), "TRAIN", x, target)
    plain = run(group_net(shape, scale_lr=0.0, fuse=False, force_backward=False), "TRAIN", x, target)
    assert not fused.params["scale"][0].diff.any() and fused.params["scale"][1].diff.any()
    assert not fused.blobs["x"].diff.any()  # nothing below the group asks for a gradient
    for key, a in arrays(plain).items():
        numpy.testing.assert_allclose(arrays(fused)[key], a, rtol=1e-10, atol=1e-12, err_msg=key)
    assert set(run(group_net(shape, slope=-0.5), "TRAIN", x, target)._fused) == {2, 3}


@pytest.mark.parametrize("shape", [(4, 3, 3, 2), (6, 2)])
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_gradient_by_central_differences(shape, phase):
    r = numpy.random.default_rng(5)
    x, target = r.standard_normal(shape), r.standard_normal(shape)
    net = run(group_net(shape, slope=0.05), phase, x, target, passes=1)
    gx, gscale = net.blobs["x"].diff.copy(), [b.diff.copy() for b in net.params["scale"]]
    h, checked = 1e-5, 0

    def loss():
        net.forward(x=x, target=target)
        return net.loss

    for value, grad in [(x, gx)] + [(b.data, g) for b, g in zip(net.params["scale"], gscale)]:
        for k in r.choice(value.size, size=min(12, value.size), replace=False):
            old = value.flat[k]
            value.flat[k] = old + h
            up = loss()
            value.flat[k] = old - h
            down = loss()
            value.flat[k] = old
            numeric, analytic = (up - down) / (2 * h), grad.flat[k]
            assert abs(numeric - analytic) <= 1e-5 * max(abs(numeric), abs(analytic), 1.0), (k, numeric, analytic)
            checked += 1
    assert checked == min(12, x.size) + 2 * shape[1]


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 4)])
def test_against_torch(shape):
    r = numpy.random.default_rng(6)
    x, target = r.standard_normal(shape), r.standard_normal(shape)
    net = run(group_net(shape), "TRAIN", x, target, passes=1)
    gamma, beta = (torch.tensor(b.data, requires_grad=True) for b in net.params["scale"])
    tx = torch.tensor(x, requires_grad=True)
    y = torch.relu(torch.nn.functional.batch_norm(1.5 * tx + 0.25, None, None, gamma, beta, training=True, eps=1e-3))
    ((y - torch.tensor(target)) ** 2).sum().div(2 * shape[0]).backward()
    numpy.testing.assert_allclose(net.blobs["h"].data, y.detach().numpy(), rtol=1e-10, atol=1e-12)
    numpy.testing.assert_allclose(net.blobs["x"].diff, tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    numpy.testing.assert_allclose(net.params["scale"][0].diff, gamma.grad.numpy(), rtol=1e-9, atol=1e-12)
    numpy.testing.assert_allclose(net.params["scale"][1].diff, beta.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_a_forward_that_starts_or_stops_inside_a_group_runs_its_layers_one_by_one():
    shape, r = (4, 3, 2, 2), numpy.random.default_rng(8)
    x, target = r.standard_normal(shape), r.standard_normal(shape)
    fused, plain = Net(group_net(shape), dtype="float64"), Net(group_net(shape, fuse=False), dtype="float64")
    plain.params["scale"][0].data[...] = fused.params["scale"][0].data
    plain.params["scale"][1].data[...] = fused.params["scale"][1].data
    for end in ("bn", "scale", "relu"):
        for net in (fused, plain):
            net.set_inputs(x=x, target=target)
            net.forward(end=end)
        numpy.testing.assert_allclose(fused.blobs["h"].data, plain.blobs["h"].data, rtol=1e-12, err_msg=end)
        assert (fused.blobs["h"].data < 0).any() == (end != "relu")  # the ReLU has run only at the end
    for net in (fused, plain):  # a range starting inside a group runs its layers on the blob as it is
        net.forward()
        net.forward(start="scale")
    numpy.testing.assert_allclose(fused.blobs["h"].data, plain.blobs["h"].data, rtol=1e-12)


@pytest.mark.parametrize("start,end", [("relu", "scale"), ("scale", "bn"), ("scale", "scale"), ("bn", "bn"),
                                       ("relu", "bn"), ("loss", "scale")])
def test_a_backward_range_that_cuts_a_group_runs_its_layers_one_by_one(start, end):
    shape, r = (4, 3, 2, 2), numpy.random.default_rng(10)
    x, target = r.standard_normal(shape), r.standard_normal(shape)
    nets = [run(group_net(shape, fuse=fuse), "TRAIN", x, target, passes=1) for fuse in (True, False)]
    for net in nets:
        net.clear_param_diffs()
        net.blobs["h"].diff[...] = target  # as pycaffe's backward(diffs=...) sets the start layer's top diff
        net.backward(start=end, end=start)  # layerforge's range runs bottom-up: from `start` down to `end`
    fused, plain = (arrays(net) for net in nets)
    for key, a in plain.items():
        numpy.testing.assert_allclose(fused[key], a, rtol=1e-10, atol=1e-12, err_msg=key)
    assert nets[0].layer_dict["scale"].blobs[0].diff.any() == (start != "bn")  # Scale ran iff in the range


def test_the_parameters_stay_with_their_layers(tmp_path):
    shape = (4, 3, 2, 2)
    fused, plain = Net(group_net(shape)), Net(group_net(shape, fuse=False))
    assert list(fused.params) == list(plain.params) == ["bn", "scale"]
    assert [b.shape for b in fused.params["bn"]] == [(3,), (3,), (1,)]
    assert [b.shape for b in fused.params["scale"]] == [(3,), (3,)]
    assert [layer.name for layer in fused.layers] == [layer.name for layer in plain.layers]
    fused.save(tmp_path / "w.npz")
    plain.load(tmp_path / "w.npz")


def test_the_net_key_is_a_boolean():
    from layerforge.errors import ConfigError
    with pytest.raises(ConfigError, match="expected true or false"):
        Net(dict(group_net((2, 3)), fuse_batch_norm="no"))


def test_fused_groups_keep_one_array_fewer():
    shape = (8, 6, 5, 5)
    r = numpy.random.default_rng(9)
    x, target = r.standard_normal(shape), r.standard_normal(shape)
    fused = run(group_net(shape), "TRAIN", x, target)
    plain = run(group_net(shape, fuse=False), "TRAIN", x, target)
    saved = plain.memory_report()["cache_bytes"] - fused.memory_report()["cache_bytes"]
    assert saved == numpy.prod(shape) * 8  # Scale's copy of its in-place input
    assert fused.memory_report()["per_layer_bytes"]["scale"] == 0


def resnet_block(fuse):
    def conv(name, bottom, n, k=3):
        return {"name": name, "type": "Convolution", "bottom": bottom, "top": name,
                "convolution": {"num_output": n, "kernel_size": k, "pad": k // 2, "bias_term": False,
                                "weight_filler": {"type": "msra"}}}

    def bn_scale(name, relu=True):
        out = [{"name": f"bn_{name}", "type": "BatchNorm", "bottom": name, "top": name},
               {"name": f"scale_{name}", "type": "Scale", "bottom": name, "top": name, "scale": {"bias_term": True}}]
        return out + ([{"name": f"{name}_relu", "type": "ReLU", "bottom": name, "top": name}] if relu else [])

    layers = [{"name": "data", "type": "DummyData", "top": ["data", "label"],
               "dummy_data": {"shape": [[6, 4, 6, 6], [6]], "integer": [False, True],
                              "data_filler": [{"type": "gaussian"}, {"type": "uniform", "min": 0, "max": 3}]}},
              conv("conv1", "data", 8), *bn_scale("conv1"),
              conv("res_a", "conv1", 8), *bn_scale("res_a"), conv("res_b", "res_a", 8), *bn_scale("res_b", False),
              {"name": "res", "type": "Eltwise", "bottom": ["conv1", "res_b"], "top": "res"},
              {"name": "res_relu", "type": "ReLU", "bottom": "res", "top": "res"},
              {"name": "pool", "type": "Pooling", "bottom": "res", "top": "pool",
               "pooling": {"pool": "AVE", "global_pooling": True}},
              {"name": "ip", "type": "InnerProduct", "bottom": "pool", "top": "ip", "inner_product": {
                  "num_output": 3, "weight_filler": {"type": "xavier"}}},
              {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]
    return {"name": "block", "fuse_batch_norm": fuse, "layers": layers}


def test_a_resnet_block_trains_identically():
    runs = []
    for fuse in (True, False):
        solver = get_solver(dict(net_param=resnet_block(fuse), base_lr=0.1, momentum=0.9, max_iter=6, random_seed=2,
                                 display=0, snapshot=0, snapshot_after_train=False, dtype="float64"))
        solver.solve()
        runs.append(solver)
    fused, plain = runs
    def kinds(net):
        return sorted(type(g).__name__ for g in {id(g): g for g in net._fused.values()}.values())
    assert kinds(fused.net) == ["BatchNormScaleReLU"] * 2 + ["BatchNormScaleSumReLU"]  # res_b's with the join
    assert kinds(plain.net) == ["EltwiseSumReLU"]  # fuse_batch_norm: false leaves the bit-exact fusion
    for name, blobs in plain.net.params.items():
        for j, b in enumerate(blobs):
            numpy.testing.assert_allclose(fused.net.params[name][j].data, b.data, rtol=1e-9, atol=1e-12,
                                          err_msg=f"{name}/{j}")
    assert list(fused.losses) == pytest.approx(list(plain.losses), rel=1e-10)


def join_net(relu_top="s", operation="SUM", coeff=None, slope=0.0):
    """Input a, b -> Eltwise -> ReLU (in place unless ``relu_top`` names another blob) -> Power -> EuclideanLoss."""
    eltwise = {"operation": operation, **({"coeff": coeff} if coeff else {})}
    return {"name": "join", "force_backward": True, "layers": [
        {"name": "input", "type": "Input", "top": ["a", "b", "target"], "input": {"shape": [[3, 4, 5, 5]] * 3}},
        {"name": "sum", "type": "Eltwise", "bottom": ["a", "b"], "top": "s", "eltwise": eltwise},
        {"name": "relu", "type": "ReLU", "bottom": "s", "top": relu_top, "relu": {"negative_slope": slope}},
        {"name": "power", "type": "Power", "bottom": relu_top, "top": "p", "power": {"scale": 1.5}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["p", "target"], "top": "loss"}]}


@pytest.mark.parametrize("slope", [0.0, 0.3])
def test_eltwise_sum_and_relu_run_as_one_with_the_layers_bits(xp, slope):
    r = numpy.random.default_rng(8)
    a, b, target = (r.standard_normal((3, 4, 5, 5)).astype(numpy.float32) for _ in range(3))
    runs = {}
    for top in ("s", "r"):  # in place: fused; into another blob: the two layers
        net = Net(join_net(top, slope=slope), xp=xp)
        net.forward(a=xp.asarray(a), b=xp.asarray(b), target=xp.asarray(target))
        net.backward()
        runs[top] = net
    fused, plain = runs["s"], runs["r"]
    assert {k: type(g).__name__ for k, g in fused._fused.items()} == {1: "EltwiseSumReLU", 2: "EltwiseSumReLU"}
    assert plain._fused == {}
    assert to_numpy(fused.blobs["s"].data).tobytes() == to_numpy(plain.blobs["r"].data).tobytes()
    for name in ("s", "a", "b"):  # the ReLU's gradient in place in s's diff, and the bottoms' copies of it
        assert to_numpy(fused.blobs[name].diff).tobytes() == to_numpy(plain.blobs[name].diff).tobytes()
    gradient = to_numpy(fused.blobs["a"].diff)
    assert (gradient != 0).any() and (gradient == 0).any() == (slope == 0)  # the mask


@pytest.mark.parametrize("definition", [join_net(coeff=[1.0, -1.0]), join_net(operation="MAX"),
                                        join_net(operation="PROD"), join_net(slope=-0.5)])
def test_other_eltwise_and_relu_pairs_are_not_fused(definition):
    assert Net(definition)._fused == {}


def residual_net(slope, global_stats, bn_first):
    """Inputs a (the shortcut) and x -> Power -> BatchNorm -> Scale in place on h -> Eltwise SUM of h and a -> ReLU in
    place (``slope``) -> Power -> EuclideanLoss: ResNet's last BatchNorm group of a block and its join."""
    definition = group_net((4, 3, 5, 6), relu=False, global_stats=global_stats)
    layers = definition["layers"]
    layers[0] = {"name": "input", "type": "Input", "top": ["x", "a", "target"], "input": {"shape": [[4, 3, 5, 6]] * 3}}
    layers[-1:] = [
        {"name": "sum", "type": "Eltwise", "bottom": ["h", "a"] if bn_first else ["a", "h"], "top": "s"},
        {"name": "relu", "type": "ReLU", "bottom": "s", "top": "s", "relu": {"negative_slope": slope}},
        {"name": "power2", "type": "Power", "bottom": "s", "top": "p", "power": {"scale": 1.5}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["p", "target"], "top": "loss"}]
    return definition


@pytest.mark.parametrize("slope", [0.0, 0.3])
@pytest.mark.parametrize("phase,global_stats", [("TRAIN", None), ("TRAIN", True), ("TEST", None)])
@pytest.mark.parametrize("bn_first", [True, False])
def test_the_join_after_a_batch_norm_group_runs_with_it_to_the_groups_bits(xp, monkeypatch, slope, phase,
                                                                           global_stats, bn_first):
    """BatchNorm + Scale and the Eltwise SUM + ReLU that reads their blob run as one group (BatchNormScaleSumReLU):
    every blob's data and diff, and the parameters' diffs, have the bits of the two groups one after the other."""
    from layerforge import rng
    from layerforge.net import fusion
    r = numpy.random.default_rng(11)
    x, a, target = (r.standard_normal((4, 3, 5, 6)).astype(numpy.float32) for _ in range(3))
    nets = []
    for merge in (True, False):
        if not merge:
            monkeypatch.setattr(fusion, "residual_join_groups", lambda net, groups: {})
        rng.seed(3)
        net = Net(residual_net(slope, global_stats, bn_first), phase=phase, xp=xp)
        for _ in range(2):
            net.clear_param_diffs()
            net.forward(x=xp.asarray(x), a=xp.asarray(a), target=xp.asarray(target))
            net.backward()
        nets.append(net)
    merged, apart = nets
    kinds = {type(g).__name__ for g in merged._fused.values()}
    assert kinds == {"BatchNormScaleSumReLU"} and {type(g).__name__ for g in apart._fused.values()} == {
        "BatchNormScaleReLU", "EltwiseSumReLU"}
    for name in ("h", "s", "a", "x"):
        for kind in ("data", "diff"):
            got, expected = (to_numpy(getattr(net.blobs[name], kind)) for net in nets)
            assert got.tobytes() == expected.tobytes(), f"{name} {kind}"
    for name, blobs in apart.params.items():
        for j, b in enumerate(blobs):
            assert to_numpy(merged.params[name][j].diff).tobytes() == to_numpy(b.diff).tobytes(), f"{name}/{j}"
            assert to_numpy(merged.params[name][j].data).tobytes() == to_numpy(b.data).tobytes(), f"{name}/{j}"
    gradient = to_numpy(merged.blobs["x"].diff)
    assert numpy.abs(gradient).max() > 0.01 and (to_numpy(merged.blobs["s"].data) == 0).any() == (slope == 0)
