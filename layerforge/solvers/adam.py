"""Adam (Kingma and Ba 2015), Caffe's adam_solver.cpp."""
import math

from ..kernels.update import adam_step
from .solver import Solver, register_solver


@register_solver("Adam")
class AdamSolver(Solver):
    """Bias-corrected moment estimates (beta1 = momentum, beta2 = momentum2, t = iter + 1)::

        m = beta1 * m + (1 - beta1) * g                 (state[0])
        v = beta2 * v + (1 - beta2) * g^2               (state[1])
        W = W - rate * lr_mult * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + delta)

    As in Caffe, the correction multiplies the step and delta is added to the uncorrected sqrt(v).
    """

    history_per_param = 2

    @classmethod
    def validate_params(cls, sp):
        if not 0 <= sp.momentum < 1:
            raise sp.error(f"Adam's beta1 (momentum) must be in [0, 1), got {sp.momentum}", "momentum")
        if not sp.momentum2 < 1:
            raise sp.error(f"Adam's beta2 (momentum2) must be in [0, 1), got {sp.momentum2}", "momentum2")

    def _correction(self):
        t = self.iter + 1
        return math.sqrt(1.0 - self.param.momentum2 ** t) / (1.0 - self.param.momentum ** t)

    def compute_update(self, param, state, rate):
        m, v = state
        beta1, beta2, g = self.param.momentum, self.param.momentum2, param.diff
        correction = self._correction()
        m[...] = beta1 * m + (1.0 - beta1) * g
        v[...] = beta2 * v + (1.0 - beta2) * (g * g)
        param.diff[...] = (rate * correction) * m / (self.xp.sqrt(v) + self.param.delta)

    def compiled_step(self, param, state, rate, decay):
        m, v = state
        return adam_step(param.data, param.diff, m, v, decay, self.param.momentum, self.param.momentum2,
                         rate * self._correction(), self.param.delta)
