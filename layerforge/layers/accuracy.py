"""Accuracy: top-k classification accuracy (an output to watch, never a loss)."""
import math

from ..backend import get_array_module
from ..errors import ShapeError
from .base import Field, Layer, register_layer
from .loss import check_label_count, class_labels
from .layer_param import canonical_axis


@register_layer("Accuracy")
class Accuracy(Layer):
    """Fraction of non-ignored positions whose label is among the ``top_k`` highest scores.

    Shapes: scores x (outer, C, inner) seen along ``axis``; labels: outer * inner integer values in a float
    blob; top[0] the accuracy (shape ()); optional top[1] the accuracy per class (C,), 0 for a class with
    no (non-ignored) label. Ties count against the label, as in Caffe: position n is correct when fewer
    than top_k *other* classes score >= x[n, label_n]. With no valid position the accuracy is 0.
    """

    param_blocks = {"accuracy": {
        "top_k": Field("int", 1, min=1, doc="a label among the k best scores counts as correct"),
        "axis": Field("int", 1, doc="the class axis"),
        "ignore_label": Field("int", None, doc="label value that is not counted"),
    }}
    num_bottom = (2, 2)
    num_top = (1, 2)
    has_backward = False
    backward_reads = ()

    def allow_force_backward(self, bottom_index):
        return False

    def reshape(self, bottom, top):
        p = self.layer_param.accuracy
        shape = bottom[0].shape
        self.axis = canonical_axis(p.axis, len(shape), "accuracy.axis")
        self.outer, self.channels = math.prod(shape[:self.axis]), shape[self.axis]
        self.inner = math.prod(shape[self.axis + 1:])
        if p.top_k > self.channels:
            raise ShapeError(f"top_k {p.top_k} exceeds the {self.channels} classes of scores of shape {shape}",
                             key="accuracy.top_k")
        check_label_count(bottom[1], self.outer * self.inner, shape, self.axis)
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape((self.channels,))

    def forward(self, bottom, top):
        p = self.layer_param.accuracy
        x = bottom[0].data.reshape(self.outer, self.channels, self.inner)
        xp = get_array_module(x)
        label, valid = class_labels(self, bottom[1], self.outer, self.inner, self.channels, p.ignore_label)
        score = xp.take_along_axis(x, label[:, None, :], axis=1)
        others_at_least = (x >= score).sum(axis=1) - 1  # the label's own score is >= itself
        correct = (others_at_least < p.top_k) & valid
        top[0].data[...] = correct.sum() / max(int(valid.sum()), 1)
        if len(top) > 1:
            total = xp.bincount(label[valid], minlength=self.channels)
            hits = xp.bincount(label[correct], minlength=self.channels)
            top[1].data[...] = xp.where(total > 0, hits / xp.maximum(total, 1), 0)

    def backward(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise NotImplementedError("Accuracy has no backward")
