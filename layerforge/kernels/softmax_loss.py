"""Softmax-with-loss sums over probabilities seen as (outer, C, inner), for numpy and cupy.

``label`` holds outer * inner class indices (any numeric dtype); positions labelled ``ignore_label``
(when given) contribute neither loss nor gradient and are not counted. As in Caffe, log(p) is taken of
max(p, FLT_MIN). cupy arrays run softmax_loss.cu.
"""
import numpy

from ..backend import get_array_module

FLT_MIN = float(numpy.finfo(numpy.float32).tiny)


def _valid_labels(xp, label, outer, inner, ignore_label):
    lab = label.reshape(outer, inner).astype(xp.int64)
    valid = xp.ones(lab.shape, dtype=bool) if ignore_label is None else lab != int(ignore_label)
    return xp.where(valid, lab, 0), valid


def softmax_loss_forward(prob, label, outer, channels, inner, ignore_label=None):
    """``(sum over valid positions of -log p[label], number of valid positions)``."""
    xp = get_array_module(prob)
    if xp is not numpy:
        from .cuda.softmax_loss import softmax_loss_forward_gpu
        return softmax_loss_forward_gpu(prob, label, outer, channels, inner, ignore_label)
    lab, valid = _valid_labels(xp, label, outer, inner, ignore_label)
    p = xp.take_along_axis(prob.reshape(outer, channels, inner), lab[:, None, :], axis=1)[:, 0, :]
    return -(xp.log(xp.maximum(p, FLT_MIN)) * valid).sum(), valid.sum()


def softmax_loss_backward(prob, label, outer, channels, inner, scale, ignore_label=None, out=None):
    """``scale * (p - onehot(label))`` at valid positions and 0 at ignored ones, shaped like ``prob``."""
    xp = get_array_module(prob)
    if xp is not numpy:
        from .cuda.softmax_loss import softmax_loss_backward_gpu
        return softmax_loss_backward_gpu(prob, label, outer, channels, inner, scale, ignore_label, out)
    lab, valid = _valid_labels(xp, label, outer, inner, ignore_label)
    onehot = xp.arange(channels)[None, :, None] == lab[:, None, :]
    g = (prob.reshape(outer, channels, inner) - onehot) * (valid[:, None, :] * scale)
    if out is None:
        return g.reshape(prob.shape)
    out[...] = g.reshape(out.shape)
    return out
