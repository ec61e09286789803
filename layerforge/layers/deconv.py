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

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        p = self.layer_param.convolution
        kernel = self.geometry[0] if self.nd else self.geometry[:2]
        channels = bottom[0].shape[self.axis]
        self.blobs[0] = self.make_param((channels, self.num_output // self.group) + tuple(kernel), p.weight_filler)

    def bottom_channels(self):
        return self.blobs[0].shape[0]

    @staticmethod
    def transposed_size(size, k, s, p, d):
        """The output extent of a transposed convolution along one axis."""
        return (size - 1) * s - 2 * p + d * (k - 1) + 1

    def reshape(self, bottom, top):
        if self.nd:
            return self._reshape_nd(bottom, top, lambda spatial: tuple(
                self.transposed_size(*a) for a in zip(spatial, *self.geometry)))
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        first = bottom[0].shape
        for b, t in zip(bottom, top):
            self._check_bottom(b)
            if b.shape != first:
                raise ShapeError(f"all bottoms need one shape, got {first} and {b.shape}", key="bottom")
            self._check_weight_channels(b.shape, b.shape[1])
            out_h = self.transposed_size(b.shape[2], kh, sy, ph, dy)
            out_w = self.transposed_size(b.shape[3], kw, sx, pw, dx)
            if out_h < 1 or out_w < 1:
                raise ShapeError(f"pad {ph}x{pw} leaves no output for bottom shape {b.shape}", key="convolution.pad")
            t.reshape(b.shape[0], self.num_output, out_h, out_w)
        # the engines see the convolution this layer transposes: from the top's shape to the bottom's
        self._choose_engines(top[0].shape, first)

    def forward(self, bottom, top):
        f = self._flat
        for x, y in zip(bottom, top):
            yf = f(y.data)
            self._run("forward", yf, self.blobs[0].data, f(x.data), None, None, yf, method="backward")
            if self.bias_term:
                yf += self.blobs[1].data.reshape((-1,) + (1,) * (yf.ndim - 2))

    def backward(self, top, propagate_down, bottom):
        f = self._flat
        for i, (x, y) in enumerate(zip(bottom, top)):
            gy = f(y.diff)
            if self.bias_term:
                self.blobs[1].diff += gy.sum(axis=(0,) + tuple(range(2, gy.ndim)))
            # gW: the transposed convolution's filter gradient is the convolution's, input y.diff, output x
            self._run("backward", gy, self.blobs[0].data, f(x.data), self.blobs[0].diff, None, None)
            if propagate_down[i]:
                self._run("backward", gy, self.blobs[0].data, None, f(x.diff), method="forward")

    def multiply_adds(self, bottom, top):
        # per input value: one multiply-add per weight it scatters through (Cout / G of them per kernel position)
        return sum(b.count * (self.blobs[0].count // self.blobs[0].shape[0]) for b in bottom)
