"""Stochastic gradient descent with momentum, and Nesterov's accelerated gradient (Caffe's formulas)."""
from ..kernels.update import nesterov_step, sgd_step
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

    def compiled_step(self, param, state, rate, decay):
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

    def compiled_step(self, param, state, rate, decay):
        return nesterov_step(param.data, param.diff, state[0], decay, self.param.momentum, rate)
