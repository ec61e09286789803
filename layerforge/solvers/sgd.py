"""Stochastic gradient descent with momentum, and Nesterov's accelerated gradient (Caffe's formulas)."""
import numpy

from ..kernels.update import sgd_step
from .solver import Solver, register_solver


@register_solver("SGD")
class SGDSolver(Solver):
    """Momentum SGD (Caffe's sgd_solver.cpp), per parameter W with gradient g (after regularisation)::

        lr = rate * lr_mult
        V  = momentum * V + lr * g          (state: V)
        W  = W - V
    """

    def compute_update(self, param, state, rate):
        (v,) = state
        v *= self.param.momentum
        v += rate * param.diff
        param.diff[...] = v

    def fused_update(self, param, state, rate, decay):
        # on the host, one compiled pass (kernels/update.py) where the decay is L2 or none
        if self.xp is not numpy or (decay and self.param.regularization_type != "L2"):
            return False
        return sgd_step(param.data, param.diff, state[0], decay, self.param.momentum, rate)


@register_solver("Nesterov")
class NesterovSolver(Solver):
    """Nesterov's accelerated gradient (Caffe's nesterov_solver.cpp)::

        lr = rate * lr_mult
        V' = momentum * V + lr * g                        (state: V)
        W  = W - ((1 + momentum) * V' - momentum * V)     (step back, then over-step)
    """

    def compute_update(self, param, state, rate):
        (v,) = state
        m = self.param.momentum
        previous = v.copy()
        v *= m
        v += rate * param.diff
        param.diff[...] = (1.0 + m) * v - m * previous
