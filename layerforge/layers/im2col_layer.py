"""Im2col (Caffe's Im2colLayer): the convolution's column matrix as a blob."""
import math

from ..errors import ShapeError
from ..kernels.im2col import col2im, col2im_nd, conv_output_shape, im2col, im2col_nd
from ..kernels.output_size import conv_output_size
from .base import Field, register_layer
from .conv import Convolution
from .layer_param import canonical_axis


@register_layer("Im2col")
class Im2col(Convolution):
    """Each convolution window's values as channels: the im2col matrix of the bottom as a blob.

    ``y[n, (c kh + i) kw + j, oy, ox] = x[n, c, oy sy - ph + i dy, ox sx - pw + j dx]`` (0 in the padding).

    Shapes: bottom (N, C, H, W) -> top (N, C kh kw, Hout, Wout), Caffe's channel-major column order and
    the convolution's output size; ``convolution_param`` gives kernel, stride, pad and dilation
    (num_output, group and the fillers are not used). N-d as Convolution (``axis``, one value per
    spatial axis, ``force_nd_im2col``): (*B, C, *S) -> (*B, C prod(kernel), *Sout), kernel positions
    in raster order within each channel. Backward: col2im, the sum of each column's gradient back into
    the pixels it came from. No parameters.
    """

    adds_bottom_diffs = False  # its backward writes the bottom's diff (no engine's data gradient)

    param_blocks = {"convolution": {**Convolution.param_blocks["convolution"],
                                    "num_output": Field("int", None, min=1, doc="not used by Im2col")}}
    num_bottom = (1, 1)
    num_top = (1, 1)
    backward_reads = ()

    @classmethod
    def validate_params(cls, lp):
        if not cls.wants_nd(lp):
            cls.read_geometry(lp)

    def layer_setup(self, bottom, top):
        shape = bottom[0].shape
        self.group, self.blobs = 1, []
        self.axis = canonical_axis(self.layer_param.convolution.axis, len(shape), "convolution.axis")
        self.nd = self.wants_nd(self.layer_param) or len(shape) - self.axis - 1 != 2
        if self.nd:
            if len(shape) - self.axis - 1 < 1:  # unlike Convolution, Caffe's Im2col needs a spatial axis
                raise ShapeError(f"Im2col needs spatial axes after the channel axis (axis {self.axis}), got bottom "
                                 f"shape {shape}", key="convolution.axis")
            self.geometry = self.read_geometry_nd(self.layer_param, len(shape) - self.axis - 1)
        else:
            self.geometry = self.read_geometry(self.layer_param)

    def reshape(self, bottom, top):
        if self.nd:
            shape = bottom[0].shape
            c = shape[self.axis]
            top[0].reshape(tuple(shape[:self.axis]) + (c * math.prod(self.geometry[0]),)
                           + conv_output_shape(shape[self.axis + 1:], *self.geometry))
            return
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        self._check_bottom(bottom[0])
        n, c, h, w = bottom[0].shape
        top[0].reshape(n, c * kh * kw, conv_output_size(h, kh, sy, ph, dy), conv_output_size(w, kw, sx, pw, dx))

    def forward(self, bottom, top):
        if self.nd:
            x = self._flat(bottom[0].data)
            col = im2col_nd(x, *self.geometry)  # (C, *k, N, *out)
            d = len(self.geometry[0])
            order = (d + 1,) + tuple(range(d + 1)) + tuple(range(d + 2, col.ndim))
            self._flat(top[0].data)[...] = col.transpose(order).reshape(self._flat(top[0].data).shape)
            return
        col = im2col(bottom[0].data, *self.geometry)  # (C, kh, kw, N, out_h, out_w)
        c, kh, kw, n, oh, ow = col.shape
        top[0].data[...] = col.transpose(3, 0, 1, 2, 4, 5).reshape(n, c * kh * kw, oh, ow)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0] and self.nd:
            kernel, stride, pad, dilation = self.geometry
            x, d = self._flat(bottom[0].data), len(kernel)
            gy = self._flat(top[0].diff)
            gy = gy.reshape((x.shape[0], x.shape[1]) + tuple(kernel) + gy.shape[2:])
            order = (1,) + tuple(range(2, 2 + d)) + (0,) + tuple(range(2 + d, gy.ndim))
            self._flat(bottom[0].diff)[...] = col2im_nd(gy.transpose(order), stride, pad, dilation, x.shape[2:])
        elif propagate_down[0]:
            kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
            n, c, h, w = bottom[0].shape
            gy = top[0].diff.reshape(n, c, kh, kw, *top[0].shape[2:]).transpose(1, 2, 3, 0, 4, 5)
            bottom[0].diff[...] = col2im(gy, sy, sx, ph, pw, h, w, dy, dx)

    def multiply_adds(self, bottom, top):
        return 0
