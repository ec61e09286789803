"""Deconvolution (Caffe's DeconvolutionLayer): the transposed convolution, run by the convolution's engines."""
from ..errors import ShapeError
from .base import register_layer
from .conv import Convolution


@register_layer("Deconvolution")
class Deconvolution(Convolution):
    """y = the transpose of a convolution applied to x: what a convolution's data gradient computes.

    Shapes: bottom (N, Cin, H, W) -> top (N, Cout, Hout, Wout), ``Hout = (H - 1) sy - 2 ph + dy (kh - 1) + 1``
    with Cout = ``num_output``. Parameters (Caffe's layout): W (Cin, Cout / G, kh, kw), b (Cout,).
    Forward runs the engines' data gradient of the convolution from Cout to Cin channels with W, and
    backward runs that convolution's forward (for gx) and its filter gradient (for gW), so IM2COL,
    IMPLICIT and AUTO serve both layers with no GEMM path of their own. N-d as Convolution (``axis``,
    one kernel/stride/pad/dilation value per spatial axis, ``force_nd_im2col``): W (Cin, Cout / G, *kernel).
    """

    adds_bottom_diffs = False  # its backward writes the bottom's diff (no engine's data gradient)

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        p = self.layer_param.convolution
        kernel = self.geometry[0] if self.nd else self.geometry[:2]
        channels = bottom[0].shape[self.axis]
        self.blobs[0] = self.make_param((channels, self.num_output // self.group) + tuple(kernel), p.weight_filler)

    def bottom_channels(self):
        return self.blobs[0].shape[0]

    @staticmethod
    def output_size(size, k, s, p, d):
        """The output extent of a transposed convolution along one axis."""
        return (size - 1) * s - 2 * p + d * (k - 1) + 1

    def _no_output(self, shape):
        ph, pw = self.geometry[4:6]
        return ShapeError(f"pad {ph}x{pw} leaves no output for bottom shape {shape}", key="convolution.pad")

    def _engine_shapes(self, bottom_shape, top_shape):
        # the engines see the convolution this layer transposes: from the top's shape to the bottom's
        return top_shape, bottom_shape

    def forward(self, bottom, top):
        f = self._flat
        for x, y in zip(bottom, top):
            yf = f(y.data)
            self.engines.run("forward", yf, self.blobs[0].data, f(x.data), None, None, yf, method="backward")
            if self.bias_term:
                yf += self.blobs[1].data.reshape((-1,) + (1,) * (yf.ndim - 2))

    def backward(self, top, propagate_down, bottom):
        f = self._flat
        for i, (x, y) in enumerate(zip(bottom, top)):
            gy = f(y.diff)
            if self.bias_term:
                self.blobs[1].diff += gy.sum(axis=(0,) + tuple(range(2, gy.ndim)))
            # gW: the transposed convolution's filter gradient is the convolution's, input y.diff, output x
            self.engines.run("backward", gy, self.blobs[0].data, f(x.data), self.blobs[0].diff, None, None)
            if propagate_down[i]:
                self.engines.run("backward", gy, self.blobs[0].data, None, f(x.diff), method="forward")

    def multiply_adds(self, bottom, top):
        # per input value: one multiply-add per weight it scatters through (Cout / G of them per kernel position)
        return sum(b.count * (self.blobs[0].count // self.blobs[0].shape[0]) for b in bottom)
