"""LRN (Caffe's local response normalisation)."""
from ..errors import ShapeError
from ..kernels.lrn import lrn_across_backward, lrn_across_forward, negative_power, window_sum
from .base import Field, Layer, register_layer


@register_layer("LRN")
class LRN(Layer):
    """``y = x * scale^(-beta)``, ``scale = k + alpha / n * sum_window x^2``.

    ACROSS_CHANNELS: the window is the n channels centred on each channel (clipped at the ends).
    WITHIN_CHANNEL: the window is the n x n spatial patch around each pixel (zero padded), alpha is divided
    by n^2 and, as in Caffe, 1 takes the place of k. Shapes: bottom (N, C, H, W) -> top of the same shape.
    Backward: ``gx = gy scale^(-beta) - (2 alpha' beta) x sum_window(gy y / scale)`` with alpha' = alpha/n
    (or alpha/n^2); forward keeps scale (and, within a channel, scale^(-beta)), so y is not read back.
    ACROSS_CHANNELS runs through :mod:`layerforge.kernels.lrn` (a CUDA kernel on cupy arrays).
    """

    param_blocks = {"lrn": {
        "local_size": Field("int", 5, min=1, doc="window length n (odd)"),
        "alpha": Field("float", 1.0, doc="scaling of the sum of squares"),
        "beta": Field("float", 0.75, doc="exponent"),
        "norm_region": Field("enum", "ACROSS_CHANNELS", choices=("ACROSS_CHANNELS", "WITHIN_CHANNEL"),
                             doc="window across channels or within each channel's plane"),
        "k": Field("float", 1.0, doc="additive constant (ACROSS_CHANNELS only)"),
    }}
    backward_reads = ("bottom",)

    @classmethod
    def validate_params(cls, lp):
        if lp.lrn.local_size % 2 == 0:
            raise lp.error(f"local_size must be odd, got {lp.lrn.local_size}", "lrn.local_size")

    def layer_setup(self, bottom, top):
        p = self.layer_param.lrn
        self.n, self.beta = p.local_size, p.beta
        if p.norm_region == "ACROSS_CHANNELS":
            self.axes, self.alpha_n, self.shift = (1,), p.alpha / p.local_size, p.k
        else:
            self.axes, self.alpha_n, self.shift = (2, 3), p.alpha / p.local_size ** 2, 1.0
        self.scale = self.power = None

    def reshape(self, bottom, top):
        if len(bottom[0].shape) != 4:
            raise ShapeError(f"LRN needs a 4-D bottom (N, C, H, W), got shape {bottom[0].shape}", key="bottom")
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        x = bottom[0].data
        xp = self.xp
        if self.axes == (1,):  # across channels: the kernel entry point (lrn.cu on cupy)
            self.scale = lrn_across_forward(x, self.n, self.alpha_n, self.shift, self.beta, out=top[0].data)[1]
            return
        scale = window_sum(x * x, self.n, self.axes)
        scale *= self.alpha_n
        scale += self.shift
        self.scale, self.power = scale, negative_power(xp, scale, self.beta)
        xp.multiply(x, self.power, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        x, gy = bottom[0].data, top[0].diff
        if self.axes == (1,):
            lrn_across_backward(x, self.scale, gy, self.n, self.alpha_n, self.beta, bottom[0].diff)
            return
        t = gy * x
        t *= self.power
        t /= self.scale  # gy y / scale
        ratio = window_sum(t, self.n, self.axes)
        ratio *= x
        ratio *= 2 * self.alpha_n * self.beta
        gx = bottom[0].diff
        xp.multiply(gy, self.power, out=gx)
        gx -= ratio
