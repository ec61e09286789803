"""MVN: mean-variance normalisation per item and channel, or per item (Caffe's MVNLayer)."""
from ..backend import get_array_module
from .base import Field, Layer, register_layer


@register_layer("MVN")
class MVN(Layer):
    """y = (x - mean) / (std + eps), or y = x - mean without ``normalize_variance``.

    Statistics over H x W (and the channels with ``across_channels``) for each item (and channel):
    x (N, C, ...). std is the population standard deviation. Backward (Caffe's formula, y the output):
    gx = (gy - mean(gy) - y mean(gy y)) / (std + eps); without variance normalisation gx = gy - mean(gy).
    """

    param_blocks = {"mvn": {
        "normalize_variance": Field("bool", True, doc="also divide by the standard deviation"),
        "across_channels": Field("bool", False, doc="statistics over C x H x W instead of per channel"),
        "eps": Field("float", 1e-9, min=0.0, doc="added to the standard deviation"),
    }}
    backward_reads = ("top",)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.groups = shape[0] if self.layer_param.mvn.across_channels else shape[0] * (shape[1] if len(shape) > 1 else 1)
        top[0].reshape(shape)

    def forward(self, bottom, top):
        p = self.layer_param.mvn
        x = bottom[0].data.reshape(self.groups, -1)
        y = x - x.mean(axis=1, keepdims=True)
        if p.normalize_variance:
            self.std = get_array_module(x).sqrt((y * y).mean(axis=1, keepdims=True)) + p.eps
            y = y / self.std
        top[0].data[...] = y.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        gy = top[0].diff.reshape(self.groups, -1)
        g = gy - gy.mean(axis=1, keepdims=True)
        if self.layer_param.mvn.normalize_variance:
            y = top[0].data.reshape(self.groups, -1)
            g = (g - y * (gy * y).mean(axis=1, keepdims=True)) / self.std
        bottom[0].diff[...] = g.reshape(bottom[0].shape)
