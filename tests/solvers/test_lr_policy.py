"""Learning-rate policies (Caffe's GetLearningRate) and warm-up, at chosen iterations."""
import math

import pytest

from layerforge.solvers import SOLVER_REGISTRY, learning_rate, load_solver_param

from . import dataset, fed_solver


def param(**keys):
    return load_solver_param({"net": "unused.yaml", "base_lr": 0.01, **keys}, SOLVER_REGISTRY)


CASES = [
    ({"lr_policy": "fixed"}, [(0, 0.01), (1000, 0.01)]),
    ({"lr_policy": "step", "gamma": 0.1, "stepsize": 10}, [(0, 0.01), (9, 0.01), (10, 0.001), (25, 1e-4)]),
    ({"lr_policy": "exp", "gamma": 0.5}, [(0, 0.01), (3, 0.00125)]),
    ({"lr_policy": "inv", "gamma": 1e-4, "power": 0.75}, [(0, 0.01), (100, 0.01 * 1.01 ** -0.75)]),
    ({"lr_policy": "multistep", "gamma": 0.1, "stepvalue": [5, 8]},
     [(4, 0.01), (5, 0.001), (7, 0.001), (8, 1e-4), (100, 1e-4)]),
    ({"lr_policy": "poly", "power": 2.0, "max_iter": 100}, [(0, 0.01), (50, 0.0025), (100, 0.0)]),
    ({"lr_policy": "sigmoid", "gamma": -0.5, "stepsize": 10},
     [(10, 0.005), (0, 0.01 / (1 + math.exp(-5))), (20, 0.01 / (1 + math.exp(5)))]),
    ({"lr_policy": "fixed", "warmup_iter": 4, "warmup_start_lr_factor": 0.25},
     [(0, 0.0025), (2, 0.00625), (4, 0.01), (50, 0.01)]),
    ({"lr_policy": "step", "gamma": 0.5, "stepsize": 2, "warmup_iter": 4},
     [(0, 0.0), (1, 0.01 * 0.25), (3, 0.005 * 0.75), (4, 0.0025)]),
]


@pytest.mark.parametrize("keys,expected", CASES, ids=[
    c[0]["lr_policy"] + ("+warmup" if "warmup_iter" in c[0] else "") for c in CASES])
def test_policy_formula(keys, expected):
    sp = param(**keys)
    for it, rate in expected:
        assert learning_rate(sp, it) == pytest.approx(rate, rel=1e-12, abs=1e-18), it


def test_solver_uses_policy_rate_and_logs_it(caplog):
    # SGD without momentum: the step of iteration t is rate(t) * g, so W moves by exactly that
    x, y = dataset(4)
    solver = fed_solver(x, y, 4, base_lr=0.2, lr_policy="step", gamma=0.5, stepsize=1, display=1)
    from . import linear_grads
    with caplog.at_level("INFO", logger="layerforge"):
        for t in range(3):
            w, b = (p.data.copy() for p in solver.net.learnable_params)
            gw, _ = linear_grads(w, b, x, y)
            solver.step(1)
            assert solver.net.learnable_params[0].data == pytest.approx(w - 0.2 * 0.5 ** t * gw, rel=1e-12)
    rates = [r.getMessage() for r in caplog.records if ", lr = " in r.getMessage()]
    assert rates == ["Iteration 0, lr = 0.2", "Iteration 1, lr = 0.1", "Iteration 2, lr = 0.05"]
