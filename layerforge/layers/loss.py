"""Loss layers: SoftmaxWithLoss (multinomial logistic loss of a softmax) and EuclideanLoss."""
import math

import numpy

from ..backend import get_array_module, to_numpy
from ..errors import DataError, ShapeError
from .base import LOSS, Field, Layer, register_layer
from .softmax import canonical_axis, softmax

# Caffe clamps probabilities at FLT_MIN (for float and double alike) so log() stays finite
FLT_MIN = float(numpy.finfo(numpy.float32).tiny)


def class_labels(layer, label_blob, outer, inner, channels, ignore_label):
    """Integer labels (outer, inner) from a float label blob, and the mask of non-ignored positions.

    Caffe casts with static_cast<int> (truncation); a non-ignored label outside [0, channels) is a DataError.
    """
    xp = get_array_module(label_blob.data)
    label = label_blob.data.reshape(outer, inner).astype(xp.int64)
    valid = xp.ones(label.shape, dtype=bool) if ignore_label is None else label != ignore_label
    bad = valid & ((label < 0) | (label >= channels))
    if bool(bad.any()):
        k = int(to_numpy(bad.reshape(-1)).argmax())
        value = float(to_numpy(label_blob.data.reshape(-1))[k])
        where = tuple(int(i) for i in numpy.unravel_index(k, label_blob.shape))
        ignore = "" if ignore_label is None else f" and is not the ignore_label {ignore_label}"
        raise DataError(f"layer '{layer.name}' ({layer.type}): label {value:g} at index {where} of the label "
                        f"blob is outside [0, {channels}){ignore}")
    return xp.where(valid, label, 0), valid



def check_label_count(labels, count, shape, axis):
    """ShapeError unless the label blob holds one value per prediction (``count`` = outer * inner)."""
    if labels.count != count:
        raise ShapeError(f"the labels (shape {labels.shape}, {labels.count} values) must number {count}, one per "
                         f"prediction of the scores (shape {shape}, class axis {axis})", key="bottom")

@register_layer("SoftmaxWithLoss")
class SoftmaxWithLoss(Layer):
    """Cross-entropy of softmax probabilities: loss = -sum_{valid n} log p[n, label_n] / normalizer.

    Shapes: scores x (outer, C, inner) seen along ``softmax.axis`` (e.g. (N, C) or (N, C, H, W));
    labels: outer * inner integer values in a float blob (e.g. (N,), (N, 1, H, W)); top[0] the scalar
    loss (shape ()); optional top[1] the probabilities p (x's shape).
    Normalizer (Caffe's ``loss.normalization``, at least 1): FULL outer*inner, VALID the non-ignored count,
    BATCH_SIZE outer, NONE 1. The legacy ``normalize`` (true = VALID, false = BATCH_SIZE) applies only when
    ``normalization`` is not given. Backward: dx = w (p - onehot(label)) / normalizer at valid positions,
    0 at ignored ones, w = top[0].diff (the loss weight). As in Caffe, top[1]'s diff is not propagated.
    """

    param_blocks = {"softmax": {"axis": Field("int", 1, doc="the class axis")}, "loss": LOSS}
    num_bottom = (2, 2)
    num_top = (1, 2)
    default_loss_weight = 1.0
    backward_reads = ()  # forward keeps the probabilities and labels it needs

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.loss
        self.ignore_label = p.ignore_label
        self.normalization = p.normalization
        if p.normalize is not None and not p.given("normalization"):
            self.normalization = "VALID" if p.normalize else "BATCH_SIZE"

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.axis = canonical_axis(self.layer_param.softmax.axis, len(shape), "softmax.axis")
        self.outer = math.prod(shape[:self.axis])
        self.channels = shape[self.axis]
        self.inner = math.prod(shape[self.axis + 1:])
        check_label_count(bottom[1], self.outer * self.inner, shape, self.axis)
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape(shape)

    def normalizer(self, valid_count):
        n = {"FULL": self.outer * self.inner, "VALID": valid_count, "BATCH_SIZE": self.outer,
             "NONE": 1}[self.normalization]
        return max(1.0, float(n))

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        self.prob = softmax(bottom[0].data, self.axis)
        self.label, self.valid = class_labels(self, bottom[1], self.outer, self.inner, self.channels,
                                              self.ignore_label)
        p = self.prob.reshape(self.outer, self.channels, self.inner)
        p_label = xp.take_along_axis(p, self.label[:, None, :], axis=1)[:, 0, :]
        loss = -(xp.log(xp.maximum(p_label, FLT_MIN)) * self.valid).sum()
        self.norm = self.normalizer(int(self.valid.sum()))
        top[0].data[...] = loss / self.norm
        if len(top) > 1:
            top[1].data[...] = self.prob

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.layer_param.error("cannot backpropagate to the label input (bottom 1)", "propagate_down")
        if not propagate_down[0]:
            return
        xp = get_array_module(self.prob)
        onehot = xp.arange(self.channels)[None, :, None] == self.label[:, None, :]
        g = (self.prob.reshape(onehot.shape) - onehot) * self.valid[:, None, :]
        bottom[0].diff[...] = (g * (top[0].diff.reshape(-1)[0] / self.norm)).reshape(bottom[0].shape)


@register_layer("EuclideanLoss")
class EuclideanLoss(Layer):
    """loss = sum((a - b)^2) / (2 N), N = a.shape[0]; a and b hold the same number of values per item.

    Shapes: a (N, ...), b (N, ...) with equal counts; top the scalar loss (shape ()).
    Backward: da = w (a - b) / N, db = -w (a - b) / N, w = top[0].diff (the loss weight).
    """

    num_bottom = (2, 2)
    default_loss_weight = 1.0
    backward_reads = ()  # forward keeps a - b

    def reshape(self, bottom, top):
        a, b = bottom[0].shape, bottom[1].shape
        if bottom[0].count != bottom[1].count or a[:1] != b[:1]:
            raise ShapeError(f"bottoms must have the same number of items and values, got shapes {a} and {b}",
                             key="bottom")
        self.num = a[0] if a else 1
        top[0].reshape(())

    def forward(self, bottom, top):
        self.diff = bottom[0].data - bottom[1].data.reshape(bottom[0].shape)
        top[0].data[...] = (self.diff * self.diff).sum() / (2.0 * self.num)

    def backward(self, top, propagate_down, bottom):
        scale = top[0].diff.reshape(-1)[0] / self.num
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                bottom[i].diff[...] = (sign * scale * self.diff).reshape(bottom[i].shape)
