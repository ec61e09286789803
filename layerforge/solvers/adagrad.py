"""AdaGrad (Duchi et al. 2011), Caffe's adagrad_solver.cpp."""
from .solver import Solver, register_solver


@register_solver("AdaGrad")
class AdaGradSolver(Solver):
    """Per-element rates from the sum of squared gradients::

        H = H + g^2                                     (history)
        W = W - rate * lr_mult * g / (sqrt(H) + delta)

    Momentum must be 0, as in Caffe.
    """

    @classmethod
    def validate_params(cls, sp):
        if sp.momentum != 0:
            raise sp.error("momentum cannot be used with AdaGrad (set it to 0)", "momentum")

    def compute_update(self, i, rate):
        p, h = self.net.learnable_params[i], self.history[i]
        g = p.diff
        h += g * g
        p.diff[...] = (rate * self.net.params_lr[i]) * g / (self.xp.sqrt(h) + self.param.delta)
