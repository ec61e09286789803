"""SPP: spatial pyramid pooling into a fixed-length vector whatever the input size (Caffe's SPPLayer)."""
import math

from ..errors import ShapeError
from ..kernels import pooling as kernels
from ..kernels.output_size import pooling_output_size
from .base import Field, Layer, register_layer

FLT_MAX = 3.4028234663852886e38


@register_layer("SPP")
class SPP(Layer):
    """y = concat over levels l = 0 .. pyramid_height - 1 of the pooling of x into 2^l x 2^l bins, flattened.

    Level l pools with kernel k = ceil(H / 2^l), stride k and pad (k 2^l - H + 1) // 2 (each of H and W), as
    Caffe does. x (N, C, H, W) -> y (N, C * sum_l 4^l). MAX or AVE pooling, with their gradients. For
    inputs smaller than 2^l some bins lie wholly in the padding: MAX gives them -FLT_MAX, AVE 0 (as Caffe).
    """

    param_blocks = {"spp": {
        "pyramid_height": Field("int", 1, min=1, doc="number of levels (bins 1, 2x2, 4x4, ...)"),
        "pool": Field("enum", "MAX", choices=("MAX", "AVE"), doc="pooling within a bin"),
    }}
    backward_reads = ("bottom",)

    @staticmethod
    def level_geometry(h, w, level):
        """(kh, kw, sy, sx, ph, pw, out_h, out_w) of pyramid level ``level`` for an H x W plane."""
        bins = 2 ** level
        kh, kw = math.ceil(h / bins), math.ceil(w / bins)
        ph, pw = (kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2
        padded = ph > 0 or pw > 0
        return (kh, kw, kh, kw, ph, pw, pooling_output_size(h, kh, kh, ph, True, padded),
                pooling_output_size(w, kw, kw, pw, True, padded))

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4 or shape[2] == 0 or shape[3] == 0:
            raise ShapeError(f"SPP needs a 4-D bottom (N, C, H, W) with H, W > 0, got shape {shape}", key="bottom")
        n, c, h, w = shape
        self.levels = [self.level_geometry(h, w, level) for level in range(self.layer_param.spp.pyramid_height)]
        self.sizes = [c * g[6] * g[7] for g in self.levels]
        top[0].reshape(n, sum(self.sizes))

    def forward(self, bottom, top):
        x, y = bottom[0].data, top[0].data
        self.argmax = []
        start = 0
        for g, size in zip(self.levels, self.sizes):
            if self.layer_param.spp.pool == "MAX":
                pooled, argmax = kernels.max_pooling_forward(x, *g)
                # a bin that lies wholly in the padding (small inputs, deep pyramids) is -FLT_MAX in Caffe
                pooled[pooled == -float("inf")] = -FLT_MAX
                self.argmax.append(argmax)
            else:
                pooled = kernels.average_pooling_forward(x, *g)
            y[:, start:start + size] = pooled.reshape(x.shape[0], size)
            start += size

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x, gy = bottom[0].data, top[0].diff
        bottom[0].diff[...] = 0
        start = 0
        for k, (g, size) in enumerate(zip(self.levels, self.sizes)):
            part = gy[:, start:start + size].reshape(x.shape[0], x.shape[1], g[6], g[7])
            if self.layer_param.spp.pool == "MAX":
                bottom[0].diff += kernels.max_pooling_backward(part, self.argmax[k], x.shape, *g[:6])
            else:
                bottom[0].diff += kernels.average_pooling_backward(part, x.shape, *g[:6])
            start += size
