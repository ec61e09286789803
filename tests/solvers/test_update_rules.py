"""Each update rule against its formula worked out step by step (Caffe's test_gradient_based_solver.cpp)."""
import math

import numpy
import pytest

from layerforge.solvers import SOLVER_REGISTRY, get_solver

from . import dataset, fed_solver, linear_grads


def reference(rule, steps, w, b, x, y, cfg, lr_mult=(1.0, 2.0), decay_mult=(1.0, 0.0)):
    """Run ``steps`` updates of ``rule`` in plain numpy, written straight from the formulas."""
    params = [w.copy(), b.copy()]
    hist = [numpy.zeros_like(p) for p in params] + [numpy.zeros_like(p) for p in params]
    lr, mom, wd, delta = cfg["base_lr"], cfg.get("momentum", 0.0), cfg.get("weight_decay", 0.0), cfg.get("delta", 1e-8)
    for t in range(steps):
        grads = list(linear_grads(params[0], params[1], x, y))
        clip = cfg.get("clip_gradients", -1)
        norm = math.sqrt(sum((g ** 2).sum() for g in grads))
        if clip >= 0 and norm > clip:
            grads = [g * clip / norm for g in grads]
        for i, (p, g) in enumerate(zip(params, grads)):
            reg = p if cfg.get("regularization_type", "L2") == "L2" else numpy.sign(p)
            g = g + wd * decay_mult[i] * reg
            rate = lr * lr_mult[i]
            h, h2 = hist[i], hist[2 + i]
            if rule == "SGD":
                h[...] = mom * h + rate * g
                step = h.copy()
            elif rule == "Nesterov":
                old = h.copy()
                h[...] = mom * h + rate * g
                step = (1 + mom) * h - mom * old
            elif rule == "AdaGrad":
                h += g ** 2
                step = rate * g / (numpy.sqrt(h) + delta)
            elif rule == "RMSProp":
                d = cfg["rms_decay"]
                h[...] = (1 - d) * g ** 2 + d * h
                step = rate * g / (numpy.sqrt(h) + delta)
            elif rule == "AdaDelta":
                h[...] = (1 - mom) * g ** 2 + mom * h
                u = g * numpy.sqrt((h2 + delta) / (h + delta))
                h2[...] = (1 - mom) * u ** 2 + mom * h2
                step = rate * u
            elif rule == "Adam":
                b1, b2 = mom, cfg["momentum2"]
                h[...] = b1 * h + (1 - b1) * g
                h2[...] = b2 * h2 + (1 - b2) * g ** 2
                step = rate * math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1)) * h / (numpy.sqrt(h2) + delta)
            p -= step
    return params


CONFIGS = {
    "SGD": {"base_lr": 0.1, "momentum": 0.9},
    "Nesterov": {"base_lr": 0.1, "momentum": 0.9},
    "AdaGrad": {"base_lr": 0.3, "delta": 1e-6},
    "RMSProp": {"base_lr": 0.05, "rms_decay": 0.9, "delta": 1e-6},
    "AdaDelta": {"base_lr": 1.0, "momentum": 0.95, "delta": 1e-6},
    "Adam": {"base_lr": 0.05, "momentum": 0.9, "momentum2": 0.999, "delta": 1e-8},
}
VARIANTS = {
    "plain": {},
    "l2": {"weight_decay": 0.1},
    "l1": {"weight_decay": 0.1, "regularization_type": "L1"},
    "clip": {"clip_gradients": 0.05},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("rule", sorted(CONFIGS))
def test_rule_matches_formula(rule, variant):
    cfg = {**CONFIGS[rule], **VARIANTS[variant]}
    x, y = dataset(4)
    solver = fed_solver(x, y, 4, type=rule, **cfg)
    w0, b0 = (p.data.copy() for p in solver.net.learnable_params)
    assert solver.net.params_lr == [1.0, 2.0] and solver.net.params_weight_decay == [1.0, 0.0]
    solver.step(3)
    want = reference(rule, 3, w0, b0, x, y, cfg)
    for got, expected in zip(solver.net.learnable_params, want):
        numpy.testing.assert_allclose(got.data, expected, rtol=1e-10, atol=1e-12)
    assert solver.iter == 3


def test_sgd_momentum_by_hand():
    # W = 2, x = 1, y = 0: loss = W^2 / 2, g = W. V1 = 0.1 * 2 = 0.2 -> W = 1.8;
    # V2 = 0.5 * 0.2 + 0.1 * 1.8 = 0.28 -> W = 1.52
    net = {"layers": [
        {"name": "data", "type": "Input", "top": ["x", "y"], "input": {"shape": [[1, 1], [1, 1]]}},
        {"name": "ip", "type": "InnerProduct", "bottom": ["x"], "top": ["ip"],
         "inner_product": {"num_output": 1, "bias_term": False, "weight_filler": {"type": "CONSTANT", "value": 2}}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["ip", "y"], "top": ["loss"]}]}
    solver = get_solver({"net_param": net, "base_lr": 0.1, "momentum": 0.5, "dtype": "float64"})
    solver.feed = lambda it, k: {"x": [[1.0]], "y": [[0.0]]}
    losses = []
    solver.add_callback(lambda it, loss: losses.append((it, loss)))
    solver.step(2)
    assert solver.net.learnable_params[0].data[0, 0] == pytest.approx(1.52, abs=1e-12)
    assert losses == [(0, pytest.approx(2.0)), (1, pytest.approx(1.62))]
    assert solver.history[0][0, 0] == pytest.approx(0.28)


def test_clip_scales_to_threshold():
    x, y = dataset(4)
    solver = fed_solver(x, y, 4, base_lr=1.0, clip_gradients=0.01)
    before = [p.data.copy() for p in solver.net.learnable_params]
    solver.step(1)
    # lr 1, lr_mult (1, 2): the weight step alone is the clipped gradient, the bias step twice it
    steps = [b - p.data for b, p in zip(before, solver.net.learnable_params)]
    norm = math.sqrt(float((steps[0] ** 2).sum() + ((steps[1] / 2) ** 2).sum()))
    assert norm == pytest.approx(0.01)


def test_every_registered_rule_is_tested():
    assert set(SOLVER_REGISTRY) == set(CONFIGS)
