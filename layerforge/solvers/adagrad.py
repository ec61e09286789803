"""AdaGrad (Duchi et al. 2011), Caffe's adagrad_solver.cpp, and the base it shares with RMSProp."""
from ..kernels.update import squared_gradient_step
from .solver import Solver, register_solver


class SquaredGradientSolver(Solver):
    """Rules that divide by the root of an accumulated squared gradient H (the state)::

        H = add * g^2 + keep * H                        (the rule's :attr:`accumulation`: (add, keep))
        W = W - rate * lr_mult * g / (sqrt(H) + delta)

    Momentum must be 0, as in Caffe.
    """

    @classmethod
    def validate_params(cls, sp):
        if sp.momentum != 0:
            raise sp.error(f"momentum cannot be used with {cls.type} (set it to 0)", "momentum")

    @property
    def accumulation(self):
        """``(add, keep)``: the rule's ``H = add * g^2 + keep * H``, in the passes and in the compiled pass."""
        raise NotImplementedError

    def accumulate(self, h, g):
        add, keep = self.accumulation
        h[...] = add * (g * g) + keep * h

    def compute_update(self, param, state, rate):
        (h,) = state
        g = param.diff
        self.accumulate(h, g)
        param.diff[...] = rate * g / (self.xp.sqrt(h) + self.param.delta)

    def compiled_step(self, param, state, rate, decay):
        add, keep = self.accumulation
        return squared_gradient_step(param.data, param.diff, state[0], decay, add, keep, rate, self.param.delta)


@register_solver("AdaGrad")
class AdaGradSolver(SquaredGradientSolver):
    """AdaGrad: H = H + g^2 (the sum of all squared gradients so far)."""

    accumulation = (1.0, 1.0)  # H + g^2 as 1 g^2 + 1 H: the same bits
