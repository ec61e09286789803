"""AdaDelta (Zeiler 2012), Caffe's adadelta_solver.cpp."""
from ..kernels.update import adadelta_step
from .solver import Solver, register_solver


@register_solver("AdaDelta")
class AdaDeltaSolver(Solver):
    """Rates from running means of squared gradients G and squared updates U (m = momentum, the decay)::

        G = (1 - m) * g^2 + m * G                       (state[0])
        u = g * sqrt((U + delta) / (G + delta))
        U = (1 - m) * u^2 + m * U                       (state[1])
        W = W - rate * lr_mult * u

    Caffe applies the learning rate after updating U; base_lr 1 gives Zeiler's original method.
    """

    history_per_param = 2

    def compute_update(self, param, state, rate):
        grad_sq, update_sq = state
        m, delta, g = self.param.momentum, self.param.delta, param.diff
        grad_sq[...] = (1.0 - m) * (g * g) + m * grad_sq
        u = g * self.xp.sqrt((update_sq + delta) / (grad_sq + delta))
        update_sq[...] = (1.0 - m) * (u * u) + m * update_sq
        param.diff[...] = rate * u

    def compiled_step(self, param, state, rate, decay):
        grad_sq, update_sq = state
        return adadelta_step(param.data, param.diff, grad_sq, update_sq, decay, self.param.momentum, rate,
                             self.param.delta)
