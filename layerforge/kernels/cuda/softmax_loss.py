"""GPU bodies of :mod:`layerforge.kernels.softmax_loss` (softmax_loss.cu)."""
from . import launch, scalar


def _ignore(ignore_label):
    return (0, 0) if ignore_label is None else (1, int(ignore_label))


def softmax_loss_forward_gpu(prob, label, outer, channels, inner, ignore_label=None):
    """``(loss sum, valid count)`` as cupy 0-d arrays, for probabilities seen as (outer, C, inner)."""
    import cupy

    prob = cupy.ascontiguousarray(prob)
    label = cupy.ascontiguousarray(label, dtype=prob.dtype).reshape(-1)
    loss = cupy.empty(outer * inner, dtype=prob.dtype)
    valid = cupy.empty_like(loss)
    launch("softmax_loss", "softmax_loss_forward", prob.dtype, loss.size,
           (prob, label, loss, valid, loss.size, channels, inner) + _ignore(ignore_label))
    return loss.sum(), valid.sum()


def softmax_loss_backward_gpu(prob, label, outer, channels, inner, scale, ignore_label=None, out=None):
    """``scale * (p - onehot(label))`` at valid positions, 0 at ignored ones, shaped like ``prob``."""
    import cupy

    prob = cupy.ascontiguousarray(prob)
    label = cupy.ascontiguousarray(label, dtype=prob.dtype).reshape(-1)
    gx = cupy.empty_like(prob) if out is None or not out.flags.c_contiguous else out
    launch("softmax_loss", "softmax_loss_backward", prob.dtype, gx.size,
           (prob, label, gx, gx.size, channels, inner) + _ignore(ignore_label) + (scalar(prob.dtype, scale),))
    if out is not None and out is not gx:
        out[...] = gx
        return out
    return gx
