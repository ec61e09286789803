"""Parameter: a learnable blob as a top (Caffe's ParameterLayer), e.g. an embedding used by several layers."""
from .base import FILLER, Field, Layer, register_layer


@register_layer("Parameter")
class Parameter(Layer):
    """top = W, a learned blob of ``shape`` (no bottoms); backward adds the top's gradient to W's.

    Caffe leaves W unfilled (zeros) unless weights are loaded; ``filler`` (layerforge) may initialise it.
    """

    param_blocks = {"parameter": {
        "shape": Field("dims", [], doc="the blob's shape"),
        "filler": Field(FILLER, doc="layerforge: initial values (default constant 0, as Caffe)"),
    }}
    num_bottom = (0, 0)
    backward_reads = ()

    def layer_setup(self, bottom, top):
        p = self.layer_param.parameter
        self.blobs = [self.make_param(tuple(p.shape), p.filler)]

    def reshape(self, bottom, top):
        top[0].reshape(self.blobs[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.blobs[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff += top[0].diff
