"""Shared fixtures of the solver tests: a linear regression net fed from fixed arrays, and its gradients."""
import numpy

from layerforge.solvers import get_solver


def linear_net(batch=4, inputs=3, outputs=2, lr_mult=(1.0, 2.0), decay_mult=(1.0, 0.0)):
    """Input x (batch, inputs), y (batch, outputs) -> InnerProduct ip -> EuclideanLoss."""
    return {"name": "linear", "layers": [
        {"name": "data", "type": "Input", "top": ["x", "y"], "input": {"shape": [[batch, inputs], [batch, outputs]]}},
        {"name": "ip", "type": "InnerProduct", "bottom": ["x"], "top": ["ip"],
         "param": [{"lr_mult": lr_mult[0], "decay_mult": decay_mult[0]},
                   {"lr_mult": lr_mult[1], "decay_mult": decay_mult[1]}],
         "inner_product": {"num_output": outputs, "weight_filler": {"type": "GAUSSIAN", "std": 0.5},
                           "bias_filler": {"type": "GAUSSIAN", "std": 0.5}}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["ip", "y"], "top": ["loss"]}]}


def dataset(n, inputs=3, outputs=2, seed=7):
    g = numpy.random.default_rng(seed)
    return g.normal(size=(n, inputs)), g.normal(size=(n, outputs))


def fed_solver(x, y, batch, net=None, **keys):
    """A float64 solver over ``linear_net`` whose ``feed`` walks through (x, y) ``batch`` rows per pass."""
    keys.setdefault("dtype", "float64")
    keys.setdefault("random_seed", 1)
    solver = get_solver({"net_param": net or linear_net(batch=batch), **keys})
    state = {"pos": 0}

    def feed(iteration, pass_index):
        i = state["pos"] % len(x)
        state["pos"] += batch
        return {"x": x[i:i + batch], "y": y[i:i + batch]}

    solver.feed = feed
    return solver


def linear_grads(w, b, x, y):
    """dL/dW, dL/db of L = sum((x W^T + b - y)^2) / (2 N)."""
    r = x @ w.T + b - y
    return r.T @ x / len(x), r.sum(axis=0) / len(x)
