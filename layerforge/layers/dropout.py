"""Dropout (Caffe's inverted dropout)."""
from .. import rng
from ..backend import get_array_module
from .base import Field, register_layer
from .neuron import NeuronLayer


@register_layer("Dropout")
class Dropout(NeuronLayer):
    """TRAIN: y = x * m / (1 - p) with m ~ Bernoulli(1 - p) per element; TEST: y = x.

    Scaling at train time keeps E[y] = x, so the TEST net needs no rescaling. ``scale_train: false`` (Fast
    R-CNN's fork, for its MSRA-trained ZF net) scales at test time instead: TRAIN y = x * m, TEST y = x (1 - p).
    ``sample_weights_test: true`` (the SegNet and ENet forks', for Bayesian SegNet's Monte Carlo dropout) samples
    a mask in TEST as in TRAIN, so repeated forwards of one input give the spread of the prediction. The mask is drawn from
    the process stream (``layerforge.rng``), so a seed reproduces it; a replica of a split batch draws the
    whole batch's mask and keeps its samples' rows (``rng.batch_draw``): replicas drop what one process would.
    Shapes: y has x's shape; in place allowed.
    Backward: dx = dy * m / (1 - p) in TRAIN, dx = dy in TEST (with ``scale_train: false``: dy * m, dy (1 - p)).
    """

    capturable = False  # a new host-drawn mask every forward

    param_blocks = {"dropout": {
        "dropout_ratio": Field("float", 0.5, min=0.0, max=1.0, doc="probability p of dropping an element, in [0, 1)"),
        "scale_train": Field("bool", True, doc="scale by 1 / (1 - p) in TRAIN; false: by 1 - p in TEST (Fast R-CNN's)"),
        "sample_weights_test": Field("bool", False, doc="drop in TEST as in TRAIN: Monte Carlo dropout (the SegNet "
                                                        "and ENet forks')"),
    }}
    backward_reads = ()

    @classmethod
    def validate_params(cls, lp):
        if lp.dropout.dropout_ratio >= 1.0:
            raise lp.error(f"must be < 1 (1 would drop everything), got {lp.dropout.dropout_ratio}",
                           "dropout.dropout_ratio")

    def layer_setup(self, bottom, top):
        self.ratio = self.layer_param.dropout.dropout_ratio
        scale_train = self.layer_param.dropout.scale_train
        self.scale = 1.0 / (1.0 - self.ratio) if scale_train else 1.0
        self.test_scale = 1.0 if scale_train else 1.0 - self.ratio
        self.mask = None
        self.samples = self.phase == "TRAIN" or self.layer_param.dropout.sample_weights_test

    def forward(self, bottom, top):
        x = bottom[0].data
        if not self.samples:
            if self.test_scale != 1.0:
                top[0].data[...] = x * self.test_scale
            elif top[0].data is not x:
                top[0].data[...] = x
            return
        keep = rng.batch_draw(rng.get_rng().random, x.shape, self.batch_split) >= self.ratio
        self.mask = get_array_module(x).asarray(keep * self.scale, dtype=x.dtype)
        top[0].data[...] = x * self.mask

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        gy = top[0].diff
        if self.samples:
            bottom[0].diff[...] = gy * self.mask
        elif self.test_scale != 1.0:
            bottom[0].diff[...] = gy * self.test_scale
        elif bottom[0].diff is not gy:
            bottom[0].diff[...] = gy
