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
    IMPLICIT and AUTO serve both layers with no GEMM path of their own.
    """

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        p, (kh, kw) = self.layer_param.convolution, self.geometry[:2]
        channels = bottom[0].shape[1]
        self.blobs[0] = self.make_param((channels, self.num_output // self.group, kh, kw), p.weight_filler)

    def reshape(self, bottom, top):
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        first = bottom[0].shape
        for b, t in zip(bottom, top):
            self._check_bottom(b)
            if b.shape != first:
                raise ShapeError(f"all bottoms need one shape, got {first} and {b.shape}", key="bottom")
            if b.shape[1] != self.blobs[0].shape[0]:
                raise ShapeError(f"bottom shape {b.shape} has {b.shape[1]} channels, the weights "
                                 f"{self.blobs[0].shape} expect {self.blobs[0].shape[0]}", key="bottom")
            out_h = (b.shape[2] - 1) * sy - 2 * ph + dy * (kh - 1) + 1
            out_w = (b.shape[3] - 1) * sx - 2 * pw + dx * (kw - 1) + 1
            if out_h < 1 or out_w < 1:
                raise ShapeError(f"pad {ph}x{pw} leaves no output for bottom shape {b.shape}", key="convolution.pad")
            t.reshape(b.shape[0], self.num_output, out_h, out_w)
        # the engines see the convolution this layer transposes: from the top's shape to the bottom's
        self._choose_engines(top[0].shape, first)

    def forward(self, bottom, top):
        for x, y in zip(bottom, top):
            self._run("forward", y.data, self.blobs[0].data, x.data, None, None, y.data, method="backward")
            if self.bias_term:
                y.data += self.blobs[1].data[:, None, None]

    def backward(self, top, propagate_down, bottom):
        for i, (x, y) in enumerate(zip(bottom, top)):
            if self.bias_term:
                self.blobs[1].diff += y.diff.sum(axis=(0, 2, 3))
            # gW: the transposed convolution's filter gradient is the convolution's, input y.diff, output x
            self._run("backward", y.diff, self.blobs[0].data, x.data, self.blobs[0].diff, None, None)
            if propagate_down[i]:
                self._run("backward", y.diff, self.blobs[0].data, None, x.diff, method="forward")

    def multiply_adds(self, bottom, top):
        kh, kw = self.geometry[:2]
        return sum(b.shape[0] * b.shape[1] * b.shape[2] * b.shape[3] * (self.num_output // self.group) * kh * kw
                   for b in bottom)
