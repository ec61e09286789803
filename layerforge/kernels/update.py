"""Each solver rule's step on the host in one pass (the solvers' update; the formulas of Caffe's sgd_solver.cpp,
nesterov_solver.cpp, adagrad_solver.cpp, rmsprop_solver.cpp, adadelta_solver.cpp and adam_solver.cpp):

    g = diff + decay * data      (L2 weight decay; none where decay is 0)
    SGD:       V = momentum V + rate g;  diff = V
    Nesterov:  V' = momentum V + rate g;  diff = (1 + momentum) V' - momentum V
    AdaGrad, RMSProp:  H = add g^2 + keep H (1 and 1; 1 - d and d);  diff = rate g / (sqrt(H) + delta)
    AdaDelta:  G = (1 - m) g^2 + m G;  u = g sqrt((U + delta) / (G + delta));  U = (1 - m) u^2 + m U;  diff = rate u
    Adam:      m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;  diff = step m / (sqrt(v) + delta)
    data = data - diff

The solver's general path makes these as numpy passes over a block of the parameter at a time (regularise, the rule,
the step: a temporary and a Python call each), which leaves the update at a third of the memory's speed; here one
compiled loop reads data, diff and the state once and writes them once (Adam's general path made ten passes, each
with a temporary: 2.3 of LeNet's 27 ms an iteration; the pass 0.4). Each value takes the same float operations in the
same order as the passes (the scalars in the arrays' dtype, no fused multiply-add), so the same bits.
"""
import numpy

from .threadpool import cpu_kernel


@cpu_kernel(reassociate=False)
def _gradient(diff, data, decay, i):
    # element i's gradient with the L2 decay's (none where decay is 0), as regularize adds it
    if decay != 0:
        return diff[i] + decay * data[i]
    return diff[i]


@cpu_kernel(reassociate=False)
def _sgd_step(data, diff, history, decay, momentum, rate):
    # the loop over the whole of the flat arrays: one from lo to hi would index with numba's wraparound and not be
    # vectorised (kernels/relu.py)
    for i in range(data.size):
        g = _gradient(diff, data, decay, i)
        v = history[i] * momentum + rate * g
        history[i] = v
        diff[i] = v
        data[i] = data[i] - v


def sgd_step(data, diff, history, decay, momentum, rate):
    """One momentum SGD step of a parameter (or a block of it) in place: numpy arrays of one shape and float dtype,
    each C-contiguous; ``decay`` the L2 weight decay (weight_decay x decay_mult), ``rate`` the learning rate x lr_mult.
    Returns False, having done nothing, for arrays it does not take (another dtype each, not contiguous)."""
    return _run(_sgd_step, (data, diff, history), (decay, momentum, rate))


@cpu_kernel(reassociate=False, ieee_division=True)  # the passes divide as numpy does
def _adam_step(data, diff, m, v, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step, delta):
    for i in range(data.size):
        g = _gradient(diff, data, decay, i)
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
    return _run(_adam_step, (data, diff, m, v), (decay, beta1, 1.0 - beta1, beta2, 1.0 - beta2, step, delta))


@cpu_kernel(reassociate=False)
def _nesterov_step(data, diff, history, decay, momentum, one_plus_momentum, rate):
    for i in range(data.size):
        g = _gradient(diff, data, decay, i)
        previous = history[i]
        v = previous * momentum + rate * g
        history[i] = v
        d = one_plus_momentum * v - momentum * previous
        diff[i] = d
        data[i] = data[i] - d


def nesterov_step(data, diff, history, decay, momentum, rate):
    """One step of Nesterov's accelerated gradient in place, as :func:`sgd_step` takes its arrays and scalars."""
    return _run(_nesterov_step, (data, diff, history), (decay, momentum, 1.0 + momentum, rate))


@cpu_kernel(reassociate=False, ieee_division=True)  # the passes divide as numpy does
def _squared_gradient_step(data, diff, h, decay, add, keep, rate, delta):
    for i in range(data.size):
        g = _gradient(diff, data, decay, i)
        total = add * (g * g) + keep * h[i]
        h[i] = total
        d = rate * g / (numpy.sqrt(total) + delta)
        diff[i] = d
        data[i] = data[i] - d


def squared_gradient_step(data, diff, h, decay, add, keep, rate, delta):
    """One AdaGrad (``add``, ``keep`` 1 and 1: a plain sum, the same bits) or RMSProp (1 - rms_decay and rms_decay)
    step in place, ``h`` the accumulated squared gradients; arrays and the other scalars as :func:`sgd_step`'s."""
    return _run(_squared_gradient_step, (data, diff, h), (decay, add, keep, rate, delta))


@cpu_kernel(reassociate=False, ieee_division=True)  # the passes divide as numpy does
def _adadelta_step(data, diff, grad_sq, update_sq, decay, momentum, one_minus_momentum, rate, delta):
    for i in range(data.size):
        g = _gradient(diff, data, decay, i)
        gs = one_minus_momentum * (g * g) + momentum * grad_sq[i]
        grad_sq[i] = gs
        u = g * numpy.sqrt((update_sq[i] + delta) / (gs + delta))
        update_sq[i] = one_minus_momentum * (u * u) + momentum * update_sq[i]
        d = rate * u
        diff[i] = d
        data[i] = data[i] - d


def adadelta_step(data, diff, grad_sq, update_sq, decay, momentum, rate, delta):
    """One AdaDelta step in place, ``grad_sq`` and ``update_sq`` the running means of the squared gradients and
    updates; arrays and the other scalars as :func:`sgd_step`'s."""
    return _run(_adadelta_step, (data, diff, grad_sq, update_sq), (decay, momentum, 1.0 - momentum, rate, delta))


def _run(kernel, arrays, scalars):
    # a compiled step on flat views of C-contiguous arrays of one float dtype, its scalars in that dtype (the passes'
    # roundings); False, nothing run, for other arrays
    dtype = arrays[0].dtype
    if dtype.kind != "f" or any(a.dtype != dtype or not a.flags.c_contiguous for a in arrays):
        return False
    kernel(*[a.reshape(-1) for a in arrays], *[dtype.type(x) for x in scalars])
    return True
