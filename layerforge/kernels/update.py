"""The momentum SGD and Adam steps on the host in one pass each (the solvers' update; Caffe's sgd_solver.cpp and
adam_solver.cpp formulas):

    g = diff + decay * data      (L2 weight decay; none where decay is 0)
    SGD:   V = momentum * V + rate * g;  diff = V
    Adam:  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;  diff = step m / (sqrt(v) + delta)
    data = data - diff

The solver's general path makes these as numpy passes over a block of the parameter at a time (regularise, the rule,
the step: a temporary and a Python call each), which leaves the update at a third of the memory's speed; here one
compiled loop reads data, diff and the state once and writes them once (Adam's general path made ten passes, each
with a temporary: 2.3 of LeNet's 27 ms an iteration). Each value takes the same float operations in the same
order as the passes (the scalars in the arrays' dtype, no fused multiply-add), so the same bits.
"""
import numpy

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
    if not _takes(dtype, data, diff, history):
        return False
    _sgd_step(data.reshape(-1), diff.reshape(-1), history.reshape(-1), dtype.type(decay), dtype.type(momentum),
              dtype.type(rate))
    return True


@cpu_kernel(reassociate=False)
def _adam_step(data, diff, m, v, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step, delta):
    for i in range(data.size):
        g = diff[i]
        if decay != 0:
            g = g + decay * data[i]
        first = beta1 * m[i] + one_minus_beta1 * g
        second = beta2 * v[i] + one_minus_beta2 * (g * g)
        m[i] = first
        v[i] = second
        d = step * first / (numpy.sqrt(second) + delta)
        diff[i] = d
        data[i] = data[i] - d


def adam_step(data, diff, m, v, decay, beta1, beta2, step, delta):
    """One Adam step of a parameter (or a block of it) in place, with the bits of the solver's passes: numpy arrays of
    one shape and float dtype, each C-contiguous; ``m``, ``v`` the moment estimates; ``decay`` the L2 weight decay,
    ``step`` the learning rate x lr_mult x the bias correction sqrt(1 - beta2^t) / (1 - beta1^t). Returns False,
    having done nothing, for arrays it does not take."""
    dtype = data.dtype
    if not _takes(dtype, data, diff, m, v):
        return False
    t = dtype.type
    _adam_step(data.reshape(-1), diff.reshape(-1), m.reshape(-1), v.reshape(-1), t(decay), t(beta1), t(1.0 - beta1),
               t(beta2), t(1.0 - beta2), t(step), t(delta))
    return True


def _takes(dtype, *arrays):
    # the compiled steps take flat views of C-contiguous arrays of one float dtype
    return dtype.kind == "f" and all(a.dtype == dtype and a.flags.c_contiguous for a in arrays)
