"""Stochastic gradient descent with momentum, and Nesterov's accelerated gradient (Caffe's formulas)."""
from .solver import Solver, register_solver


@register_solver("SGD")
class SGDSolver(Solver):
    """Momentum SGD (Caffe's sgd_solver.cpp), per parameter W with gradient g (after regularisation)::

        lr = rate * lr_mult
        V  = momentum * V + lr * g          (history)
        W  = W - V
    """

    def compute_update(self, i, rate):
        p, v = self.net.learnable_params[i], self.history[i]
        v *= self.param.momentum
        v += (rate * self.net.params_lr[i]) * p.diff
        p.diff[...] = v


@register_solver("Nesterov")
class NesterovSolver(Solver):
    """Nesterov's accelerated gradient (Caffe's nesterov_solver.cpp)::

        lr = rate * lr_mult
        V' = momentum * V + lr * g
        W  = W - ((1 + momentum) * V' - momentum * V)     (step back, then over-step)
    """

    def compute_update(self, i, rate):
        p, v = self.net.learnable_params[i], self.history[i]
        m = self.param.momentum
        previous = v.copy()
        v *= m
        v += (rate * self.net.params_lr[i]) * p.diff
        p.diff[...] = (1.0 + m) * v - m * previous
