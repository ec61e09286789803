"""RMSProp (Tieleman and Hinton 2012), Caffe's rmsprop_solver.cpp."""
from .solver import Solver, register_solver


@register_solver("RMSProp")
class RMSPropSolver(Solver):
    """Per-element rates from a running mean of squared gradients (d = rms_decay)::

        H = (1 - d) * g^2 + d * H                       (history)
        W = W - rate * lr_mult * g / (sqrt(H) + delta)

    Momentum must be 0, as in Caffe.
    """

    @classmethod
    def validate_params(cls, sp):
        if sp.momentum != 0:
            raise sp.error("momentum cannot be used with RMSProp (set it to 0)", "momentum")

    def compute_update(self, i, rate):
        p, h = self.net.learnable_params[i], self.history[i]
        g, d = p.diff, self.param.rms_decay
        h[...] = (1.0 - d) * (g * g) + d * h
        p.diff[...] = (rate * self.net.params_lr[i]) * g / (self.xp.sqrt(h) + self.param.delta)
