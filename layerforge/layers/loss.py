"""Loss layers: SoftmaxWithLoss, InfogainLoss, MultinomialLogisticLoss, SigmoidCrossEntropyLoss, EuclideanLoss,
ContrastiveLoss and HingeLoss, with Caffe's parameters, normalisations and gradients."""
import math

import numpy

from ..backend import get_array_module, to_numpy
from ..errors import DataError, LabelError, ShapeError
from ..kernels.softmax_loss import softmax_loss_backward, softmax_loss_forward
from .base import LOSS, Field, Layer, register_layer
from .layer_param import canonical_axis
from .softmax import softmax

# Caffe clamps probabilities at FLT_MIN (for float and double alike) so log() stays finite
FLT_MIN = float(numpy.finfo(numpy.float32).tiny)
# ... except in the losses derived from LossLayer's kLOG_THRESHOLD (InfogainLoss, MultinomialLogisticLoss)
LOG_THRESHOLD = 1e-20


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
        raise LabelError(f"layer '{layer.name}' ({layer.type}): label {value:g} at index {where} of the label "
                         f"blob is outside [0, {channels}){ignore}", bottom=1, position=k, index=where)
    return xp.where(valid, label, 0), valid



# the SegNet and ENet forks' LossParameter fields, which their SoftmaxWithLoss reads
CLASS_WEIGHTING = {
    "weight_by_label_freqs": Field("bool", False, doc="weight each position's loss and gradient by "
                                                      "class_weighting[label] (the SegNet / ENet forks')"),
    "class_weighting": Field("floats", [], doc="one weight per class, with weight_by_label_freqs"),
}


def check_label_count(labels, count, shape, axis):
    """ShapeError unless the label blob holds one value per prediction (``count`` = outer * inner)."""
    if labels.count != count:
        raise ShapeError(f"the labels (shape {labels.shape}, {labels.count} values) must number {count}, one per "
                         f"prediction of the scores (shape {shape}, class axis {axis})", key="bottom")

class LossLayer(Layer):
    """Base of the losses (Caffe's LossLayer): predictions and labels in, a scalar loss out, loss weight 1 by default.

    Bottoms from ``label_bottom`` on (labels, targets, H) never take a gradient.
    """

    num_bottom = (2, 2)
    default_loss_weight = 1.0
    label_bottom = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index < self.label_bottom

    def refuse_label_gradient(self, propagate_down):
        """ConfigError when the net asks for a gradient into a label bottom."""
        if any(propagate_down[self.label_bottom:]):
            raise self.layer_param.error(f"cannot backpropagate to the labels (bottom {self.label_bottom} on)",
                                         "propagate_down")


class _LossNormalization:
    """Caffe's loss normalisation (LossParameter): FULL, VALID, BATCH_SIZE or NONE, and the legacy ``normalize``."""

    default_normalization = None  # without normalization or normalize: None is the schema's default (VALID)

    @classmethod
    def normalization_of(cls, loss_param):
        """The normalisation a LossParameter gives this layer type: ``normalization``, else the legacy
        ``normalize`` (true: VALID, false: BATCH_SIZE), else the type's default."""
        if loss_param.given("normalization"):
            return loss_param.normalization
        if loss_param.normalize is not None:
            return "VALID" if loss_param.normalize else "BATCH_SIZE"
        return cls.default_normalization or loss_param.normalization

    def read_normalization(self):
        p = self.layer_param.loss
        self.ignore_label = p.ignore_label
        self.normalization = self.normalization_of(p)

    def normalizer(self, valid_count):
        """The divisor of the summed loss (at least 1): all positions, the valid ones, the batch, or 1."""
        n = {"FULL": self.outer * self.inner, "VALID": valid_count, "BATCH_SIZE": self.outer,
             "NONE": 1}[self.normalization]
        return max(1.0, float(n))


@register_layer("SoftmaxWithLoss")
class SoftmaxWithLoss(_LossNormalization, LossLayer):
    """Cross-entropy of softmax probabilities: loss = -sum_{valid n} log p[n, label_n] / normalizer.

    Shapes: scores x (outer, C, inner) seen along ``softmax.axis`` (e.g. (N, C) or (N, C, H, W));
    labels: outer * inner integer values in a float blob (e.g. (N,), (N, 1, H, W)); top[0] the scalar
    loss (shape ()); optional top[1] the probabilities p (x's shape).
    Normalizer (Caffe's ``loss.normalization``, at least 1): FULL outer*inner, VALID the non-ignored count,
    BATCH_SIZE outer, NONE 1. The legacy ``normalize`` (true = VALID, false = BATCH_SIZE) applies only when
    ``normalization`` is not given. Backward: dx = w (p - onehot(label)) / normalizer at valid positions,
    0 at ignored ones, w = top[0].diff (the loss weight). As in Caffe, top[1]'s diff is not propagated.
    """

    param_blocks = {"softmax": {"axis": Field("int", 1, doc="the class axis")}, "loss": dict(LOSS, **CLASS_WEIGHTING)}
    num_top = (1, 2)
    backward_reads = ()  # forward keeps the probabilities and labels it needs

    axis_key = "softmax.axis"
    class_weights = None

    def layer_setup(self, bottom, top):
        self.read_normalization()
        self.read_class_weighting()

    def read_class_weighting(self):
        """The SegNet fork's class weights (a list of C floats), or None: each valid position's loss and gradient
        are multiplied by the weight of its label, the normaliser left as it is."""
        p = self.layer_param.loss
        self.class_weights = None
        if "weight_by_label_freqs" not in self.param_blocks["loss"]:
            return
        if p.class_weighting and not p.weight_by_label_freqs:
            raise self.layer_param.error("class_weighting applies only with weight_by_label_freqs: true (as in "
                                         "the SegNet fork)", "loss.class_weighting")
        if p.weight_by_label_freqs:
            self.class_weights = list(p.class_weighting)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        block, key = self.axis_key.split(".")
        self.axis = canonical_axis(getattr(getattr(self.layer_param, block), key), len(shape), self.axis_key)
        self.outer = math.prod(shape[:self.axis])
        self.channels = shape[self.axis]
        self.inner = math.prod(shape[self.axis + 1:])
        check_label_count(bottom[1], self.outer * self.inner, shape, self.axis)
        if self.class_weights is not None and len(self.class_weights) != self.channels:
            raise self.layer_param.error(f"class_weighting has {len(self.class_weights)} values for "
                                         f"{self.channels} classes", "loss.class_weighting")
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape(shape)

    def _probabilities(self, bottom):
        """Softmax of the scores and the checked labels (kept for backward); p as (outer, C, inner)."""
        self.prob = softmax(bottom[0].data, self.axis)
        self.label, self.valid = class_labels(self, bottom[1], self.outer, self.inner, self.channels,
                                              self.ignore_label)
        return self.prob.reshape(self.outer, self.channels, self.inner)

    def _write_loss(self, loss, top):
        """The summed loss, normalised, into top 0; the probabilities into the optional top 1."""
        self.norm = self.normalizer(int(self.valid.sum()))
        top[0].data[...] = loss / self.norm
        if len(top) > 1:
            top[1].data[...] = self.prob

    def forward(self, bottom, top):
        prob = self._probabilities(bottom)
        if self.class_weights is None:
            loss, _ = softmax_loss_forward(self.prob, *self._kernel_labels())
        else:
            xp = get_array_module(prob)
            p = xp.take_along_axis(prob, self.label[:, None, :], axis=1)[:, 0, :]
            loss = -(xp.log(xp.maximum(p, FLT_MIN)) * self._position_weights()).sum()
        self._write_loss(loss, top)

    def _position_weights(self):
        """(outer, inner): the class weight of each position's label, 0 where ignored."""
        xp = get_array_module(self.prob)
        return xp.asarray(self.class_weights, dtype=self.prob.dtype)[self.label] * self.valid

    def backward(self, top, propagate_down, bottom):
        self.refuse_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        label, outer, channels, inner, ignore = self._kernel_labels()
        scale = float(top[0].diff.reshape(-1)[0]) / self.norm
        softmax_loss_backward(self.prob, label, outer, channels, inner, scale, ignore, out=bottom[0].diff)
        if self.class_weights is not None:  # the fork scales the whole gradient of a position by its weight
            bottom[0].diff.reshape(outer, channels, inner)[...] *= self._position_weights()[:, None, :]

    def _kernel_labels(self):
        """The checked labels and geometry as kernels.softmax_loss takes them; ignored positions labelled -1."""
        if self.ignore_label is None:
            return self.label, self.outer, self.channels, self.inner, None
        xp = get_array_module(self.label)
        return xp.where(self.valid, self.label, -1), self.outer, self.channels, self.inner, -1


@register_layer("InfogainLoss")
class InfogainLoss(SoftmaxWithLoss):
    """loss = -sum_{valid n} sum_k H[label_n, k] log p[n, k] / normalizer, p = softmax of x along ``axis``.

    H (C x C) is the infogain matrix: a third bottom, or ``source`` (Caffe's .binaryproto BlobProto, or a .npy file).
    With H = I this is SoftmaxWithLoss. Shapes and normalisation as SoftmaxWithLoss; optional top[1] p.
    Backward: dx[n, j] = w (p[n, j] sum_k H[label_n, k] - H[label_n, j]) / normalizer at valid positions.
    """

    param_blocks = {"infogain_loss": {
        "source": Field("str", None, doc="file of the H matrix (Caffe's .binaryproto, or .npy) when no bottom 2"),
        "axis": Field("int", 1, doc="the class axis")}, "loss": LOSS}
    num_bottom = (2, 3)
    axis_key = "infogain_loss.axis"

    @classmethod
    def validate_params(cls, lp):
        source = lp.infogain_loss.source
        if len(lp.bottom) < 3 and not source:
            raise lp.error("needs the H matrix: a third bottom or infogain_loss.source", "infogain_loss.source")
        if lp.loss.normalize is not None:
            raise lp.error("normalize is deprecated for InfogainLoss (Caffe refuses it); use loss.normalization",
                           "loss.normalize")

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self.fixed_h = None if len(bottom) > 2 else self.xp.asarray(self._read_h(), dtype=self.dtype)

    def _read_h(self):
        path = self.layer_param.infogain_loss.source
        if not path.endswith(".npy"):  # Caffe's own: a BlobProto (legacy 1 x 1 x C x C, or a shape)
            from ..caffe.blobproto import read_blobproto

            return read_blobproto(path)
        try:
            return numpy.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"layer '{self.name}' ({self.type}): {path}: cannot read the H matrix: {e}") from None

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        h = bottom[2].data if len(bottom) > 2 else self.fixed_h
        if h.size != self.channels * self.channels:
            raise ShapeError(f"H has {h.size} values but {self.channels} classes need {self.channels}x{self.channels}",
                             key="bottom" if len(bottom) > 2 else "infogain_loss.source")

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        self.h = (bottom[2].data if len(bottom) > 2 else self.fixed_h).reshape(self.channels, self.channels)
        p = self._probabilities(bottom)
        rows = self.h[self.label]  # (outer, inner, C): H[label_n]
        log_p = xp.log(xp.maximum(p, LOG_THRESHOLD)).transpose(0, 2, 1)
        self._write_loss(-((rows * log_p).sum(axis=2) * self.valid).sum(), top)

    def backward(self, top, propagate_down, bottom):
        self.refuse_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        rows = self.h[self.label].transpose(0, 2, 1)  # (outer, C, inner)
        p = self.prob.reshape(rows.shape)
        g = (p * rows.sum(axis=1, keepdims=True) - rows) * self.valid[:, None, :]
        bottom[0].diff[...] = (g * (top[0].diff.reshape(-1)[0] / self.norm)).reshape(bottom[0].shape)


@register_layer("MultinomialLogisticLoss")
class MultinomialLogisticLoss(LossLayer):
    """loss = -sum_n log(max(p[n, label_n], 1e-20)) / N for probabilities p (N, C...) and labels (N,).

    Backward: dp[n, label_n] = -w / (N max(p[n, label_n], 1e-20)), 0 elsewhere (Caffe's kLOG_THRESHOLD).
    """

    backward_reads = ("bottom",)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.num = shape[0]
        self.outer, self.inner = self.num, 1
        self.dim = bottom[0].count // max(self.num, 1)
        check_label_count(bottom[1], self.num, shape, 1)
        top[0].reshape(())

    def _picked(self, bottom):
        xp = get_array_module(bottom[0].data)
        self.label, _ = class_labels(self, bottom[1], self.num, 1, self.dim, None)
        p = bottom[0].data.reshape(self.num, self.dim)
        return xp.maximum(xp.take_along_axis(p, self.label, axis=1)[:, 0], LOG_THRESHOLD)

    def forward(self, bottom, top):
        top[0].data[...] = -get_array_module(bottom[0].data).log(self._picked(bottom)).sum() / self.num

    def backward(self, top, propagate_down, bottom):
        self.refuse_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        xp = get_array_module(bottom[0].data)
        picked = self._picked(bottom)
        onehot = xp.arange(self.dim)[None, :] == self.label  # label: (N, 1)
        g = onehot * (-top[0].diff.reshape(-1)[0] / self.num / picked)[:, None]
        bottom[0].diff[...] = g.reshape(bottom[0].shape)


@register_layer("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLoss(_LossNormalization, LossLayer):
    """loss = -sum_{valid i} [t_i log s(x_i) + (1 - t_i) log(1 - s(x_i))] / normalizer, s the logistic function.

    Shapes: x and targets t with the same count, x (N, ...): the normaliser's batch is N, its FULL count
    all values; positions whose target equals ``ignore_label`` count neither loss nor gradient. Without
    ``normalization`` or ``normalize`` the loss is divided by N (BATCH_SIZE), Caffe's default here.
    Computed stably as x (t - [x >= 0]) - log(1 + exp(x - 2 x [x >= 0])). Backward: dx = w (s(x) - t) / normalizer.
    """

    param_blocks = {"loss": LOSS}
    backward_reads = ("bottom",)
    default_normalization = "BATCH_SIZE"  # Caffe's default for this layer (VALID for the softmax losses)

    def layer_setup(self, bottom, top):
        self.read_normalization()

    def reshape(self, bottom, top):
        if bottom[0].count != bottom[1].count:
            raise ShapeError(f"the targets (shape {bottom[1].shape}) must have as many values as the scores "
                             f"(shape {bottom[0].shape})", key="bottom")
        self.outer = bottom[0].shape[0] if bottom[0].shape else 1
        self.inner = bottom[0].count // max(self.outer, 1)
        top[0].reshape(())

    def _valid(self, t):
        xp = get_array_module(t)
        # Caffe compares static_cast<int>(target): truncation toward zero
        return xp.ones(t.shape, dtype=bool) if self.ignore_label is None else xp.trunc(t) != self.ignore_label

    def forward(self, bottom, top):
        x, t = bottom[0].data, bottom[1].data.reshape(bottom[0].shape)
        xp = get_array_module(x)
        positive = x >= 0
        terms = x * (t - positive) - xp.log1p(xp.exp(x - 2 * x * positive))
        valid = self._valid(t)
        self.norm = self.normalizer(int(valid.sum()))
        top[0].data[...] = -(terms * valid).sum() / self.norm

    def backward(self, top, propagate_down, bottom):
        self.refuse_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        x, t = bottom[0].data, bottom[1].data.reshape(bottom[0].shape)
        g = (0.5 * get_array_module(x).tanh(0.5 * x) + 0.5 - t) * self._valid(t)
        bottom[0].diff[...] = g * (top[0].diff.reshape(-1)[0] / self.norm)


@register_layer("EuclideanLoss")
class EuclideanLoss(LossLayer):
    """loss = sum((a - b)^2) / (2 N), N = a.shape[0]; a and b hold the same number of values per item.

    Shapes: a (N, ...), b (N, ...) with equal counts; top the scalar loss (shape ()).
    Backward: da = w (a - b) / N, db = -w (a - b) / N, w = top[0].diff (the loss weight).
    """

    backward_reads = ()  # forward keeps a - b
    label_bottom = 2  # both bottoms take a gradient

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


@register_layer("ContrastiveLoss")
class ContrastiveLoss(LossLayer):
    """loss = sum_n [y_n d_n^2 + (1 - y_n) max(margin - d_n, 0)^2] / (2 N), d_n = ||a_n - b_n||.

    Bottoms: a and b (N, C, ...) of equal shape, y (N,) similarity (1 similar, 0 dissimilar).
    ``legacy_version`` uses Caffe's first form, max(margin - d_n^2, 0) for dissimilar pairs.
    Backward (a; b gets the opposite sign): similar (a - b) w / N; dissimilar, while the margin is not
    met, -(margin - d) (a - b) / (d + 1e-4) w / N (legacy: -(a - b) w / N). No gradient into y.
    """

    param_blocks = {"contrastive_loss": {
        "margin": Field("float", 1.0, doc="dissimilar pairs closer than this are penalised"),
        "legacy_version": Field("bool", False, doc="Caffe's first form: max(margin - d^2, 0) instead of "
                                                   "max(margin - d, 0)^2")}}
    num_bottom = (3, 3)
    backward_reads = ("bottom",)
    label_bottom = 2

    def reshape(self, bottom, top):
        a, b = bottom[0].shape, bottom[1].shape
        if a != b:
            raise ShapeError(f"a and b must have the same shape, got {a} and {b}", key="bottom")
        self.num = a[0] if a else 1
        if bottom[2].count != self.num:
            raise ShapeError(f"the similarity labels (shape {bottom[2].shape}) must number {self.num}, one per pair",
                             key="bottom")
        top[0].reshape(())

    def forward(self, bottom, top):
        p = self.layer_param.contrastive_loss
        xp = get_array_module(bottom[0].data)
        self.diff = (bottom[0].data - bottom[1].data).reshape(self.num, -1)
        self.dist_sq = (self.diff * self.diff).sum(axis=1)
        self.similar = xp.trunc(bottom[2].data.reshape(-1)) != 0  # Caffe: static_cast<int>(y) != 0
        if p.legacy_version:
            far = xp.maximum(p.margin - self.dist_sq, 0)
        else:
            far = xp.maximum(p.margin - xp.sqrt(self.dist_sq), 0) ** 2
        top[0].data[...] = xp.where(self.similar, self.dist_sq, far).sum() / (2.0 * self.num)

    def backward(self, top, propagate_down, bottom):
        self.refuse_label_gradient(propagate_down)
        p = self.layer_param.contrastive_loss
        xp = get_array_module(self.diff)
        scale = top[0].diff.reshape(-1)[0] / self.num
        if p.legacy_version:
            far = xp.where(p.margin - self.dist_sq > 0, -1.0, 0.0)
        else:
            dist = xp.sqrt(self.dist_sq)
            gap = p.margin - dist
            far = xp.where(gap > 0, -gap / (dist + 1e-4), 0.0)
        per_pair = xp.where(self.similar, 1.0, far)[:, None] * self.diff
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                bottom[i].diff[...] = (sign * scale * per_pair).reshape(bottom[i].shape)


@register_layer("HingeLoss")
class HingeLoss(LossLayer):
    """One-vs-all hinge loss: loss = sum_{n,k} max(0, 1 - delta_nk x_nk)^p / N, p = 1 (L1) or 2 (L2).

    delta_nk = 1 for the true class k = l_n and -1 otherwise.

    Shapes: scores x (N, C...) (all values after axis 0 are the classes), labels (N,).
    Backward: dx_nk = -delta w sign(m_nk) / N (L1) or -2 delta w m_nk / N (L2), m = max(0, 1 - delta x).
    """

    param_blocks = {"hinge_loss": {"norm": Field("enum", "L1", choices=("L1", "L2"), doc="L1 or squared (L2) hinge")}}
    backward_reads = ()

    def reshape(self, bottom, top):
        self.num = bottom[0].shape[0]
        self.dim = bottom[0].count // max(self.num, 1)
        check_label_count(bottom[1], self.num, bottom[0].shape, 1)
        top[0].reshape(())

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        label, _ = class_labels(self, bottom[1], self.num, 1, self.dim, None)
        self.delta = xp.where(xp.arange(self.dim)[None, :] == label, 1.0, -1.0)
        self.margin = xp.maximum(0, 1 - self.delta * bottom[0].data.reshape(self.num, self.dim))
        power = 1 if self.layer_param.hinge_loss.norm == "L1" else 2
        top[0].data[...] = (self.margin ** power).sum() / self.num

    def backward(self, top, propagate_down, bottom):
        self.refuse_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        xp = get_array_module(self.margin)
        scale = top[0].diff.reshape(-1)[0] / self.num
        m = xp.sign(self.margin) if self.layer_param.hinge_loss.norm == "L1" else 2 * self.margin
        bottom[0].diff[...] = (-self.delta * m * scale).reshape(bottom[0].shape)
