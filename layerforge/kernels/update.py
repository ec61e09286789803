"""The momentum SGD step on the host in one pass (the solvers' update; Caffe's sgd_solver.cpp formulas):

    g = diff + decay * data      (L2 weight decay; none where decay is 0)
    V = momentum * V + rate * g
    diff = V;  data = data - V

The solver's general path makes these as numpy passes over a block of the parameter at a time (regularise, the rule,
the step: a temporary and a Python call each), which leaves the update at a third of the memory's speed; here one
compiled loop reads data, diff and V once and writes them once. Each value takes the same float operations in the same
order as the passes (the scalars in the arrays' dtype, no fused multiply-add), so the same bits.
"""
from .threadpool import cpu_kernel


@cpu_kernel(reassociate=False)
def _sgd_step(data, diff, history, decay, momentum, rate):
    # the loop over the whole of the flat arrays: one from lo to hi would index with numba's wraparound and not be
    # vectorised (kernels/relu.py)
    for i in range(data.size):
        g = diff[i]
        if decay != 0:
            g = g + decay * data[i]
        v = history[i] * momentum + rate * g
        history[i] = v
        diff[i] = v
        data[i] = data[i] - v


def sgd_step(data, diff, history, decay, momentum, rate):
    """One momentum SGD step of a parameter (or a block of it) in place: numpy arrays of one shape and float dtype,
    each C-contiguous; ``decay`` the L2 weight decay (weight_decay x decay_mult), ``rate`` the learning rate x lr_mult.
    Returns False, having done nothing, for arrays it does not take (another dtype each, not contiguous)."""
    dtype = data.dtype
    if dtype.kind != "f" or diff.dtype != dtype or history.dtype != dtype or \
            not (data.flags.c_contiguous and diff.flags.c_contiguous and history.flags.c_contiguous):
        return False
    _sgd_step(data.reshape(-1), diff.reshape(-1), history.reshape(-1), dtype.type(decay), dtype.type(momentum),
              dtype.type(rate))
    return True
