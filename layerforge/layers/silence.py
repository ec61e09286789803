"""Silence: consume blobs nobody else reads, so they are not net outputs (Caffe's SilenceLayer)."""
from .base import Layer, register_layer


@register_layer("Silence")
class Silence(Layer):
    """Any number of bottoms, no tops. Forward does nothing; backward gives the bottoms zero gradients."""

    num_bottom = (1, None)
    num_top = (0, 0)
    backward_reads = ()

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        for b, down in zip(bottom, propagate_down):
            if down:
                b.diff[...] = 0
