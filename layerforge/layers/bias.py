"""Bias: add a broadcast bias (learned, or a second bottom) (Caffe's BiasLayer); Scale's broadcasting rules."""
from .base import FILLER, Field, register_layer
from .scale import Scale


@register_layer("Bias")
class Bias(Scale):
    """y = x + b, with b of shape x.shape[axis:axis + k] broadcast over the other axes.

    One bottom: b is a learned blob with k = ``num_axes`` (-1: to the last axis; 0: a scalar), filled by
    ``filler`` (default constant 0). Two bottoms: b is bottom[1] (k = its rank) and takes a gradient.
    Gradients, summing over the axes outside [axis, axis + k): gx = gy, gb = sum(gy). In place allowed.
    """

    param_blocks = {"bias": {
        "axis": Field("int", 1, doc="first axis of x the bias spans (negative counts from the end)"),
        "num_axes": Field("int", 1, min=-1, doc="one bottom: axes the bias spans (-1: to the end, 0: scalar)"),
        "filler": Field(FILLER, doc="one bottom: initial bias (default constant 0)"),
    }}
    backward_reads = ()
    block = "bias"

    def has_bias_term(self):
        return False

    def forward(self, bottom, top):
        self.xp.add(bottom[0].data, self._broadcast(self._scale(bottom).data), out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        gy = top[0].diff
        if len(bottom) == 1:
            self.blobs[0].diff += self._reduce(gy)
        elif propagate_down[1]:
            bottom[1].diff[...] = self._reduce(gy)
        if propagate_down[0] and bottom[0].diff is not gy:
            bottom[0].diff[...] = gy
