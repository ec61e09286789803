"""RMSProp (Tieleman and Hinton 2012), Caffe's rmsprop_solver.cpp."""
from .adagrad import SquaredGradientSolver
from .solver import register_solver


@register_solver("RMSProp")
class RMSPropSolver(SquaredGradientSolver):
    """RMSProp: H = (1 - d) * g^2 + d * H, a running mean of squared gradients (d = rms_decay)."""

    @property
    def accumulation(self):
        return 1.0 - self.param.rms_decay, self.param.rms_decay
