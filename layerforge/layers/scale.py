"""Scale: multiply by a broadcast scale (learned, or a second bottom) and optionally add a bias (Caffe's ScaleLayer)."""
import math

from ..errors import ShapeError
from ..kernels.blas import row_sums
from ..kernels.threadpool import elementwise
from ..schema import Context, validate_block
from .base import FILLER, Field, Layer, register_layer

_ONE = validate_block({"type": "CONSTANT", "value": 1.0}, FILLER, Context())


@register_layer("Scale")
class Scale(Layer):
    """y = x * s (+ b), with s and b of shape x.shape[axis:axis + k] broadcast over the other axes.

    One bottom: s is a learned blob with k = ``num_axes`` (-1: to the last axis; 0: a scalar), filled by
    ``filler`` (default constant 1). Two bottoms: s is bottom[1] (k = its rank) and takes a gradient.
    ``bias_term`` adds a learned b of s's shape (``bias_filler``, default constant 0). Blobs: [s] (one
    bottom only), then [b] if ``bias_term``. Works in place (a copy of x is kept for gs).

    Gradients, summing over the axes outside [axis, axis + k): gx = gy * s, gs = sum(gy * x), gb = sum(gy).
    """

    param_blocks = {"scale": {
        "axis": Field("int", 1, doc="first axis of x the scale spans (negative counts from the end)"),
        "num_axes": Field("int", 1, min=-1, doc="one bottom: axes the scale spans (-1: to the end, 0: scalar)"),
        "filler": Field(FILLER, _ONE, doc="one bottom: initial scale (default constant 1)"),
        "bias_term": Field("bool", False, doc="also learn a bias of the scale's shape"),
        "bias_filler": Field(FILLER, doc="initial bias (default constant 0)"),
    }}
    num_bottom = (1, 2)
    backward_reads = ("bottom",)
    block = "scale"  # the parameter block, shared with Bias (its subclass) by name

    @property
    def params(self):
        return getattr(self.layer_param, self.block)

    def has_bias_term(self):
        return self.params.bias_term

    def _axis(self, ndim, scale_ndim):
        axis = self.params.axis
        if scale_ndim == 0:
            return 0  # a scalar broadcasts over everything: the axis does not matter (Caffe does the same)
        a = axis + ndim if axis < 0 else axis
        if not 0 <= a < ndim:
            raise ShapeError(f"axis {axis} is out of range for a bottom of {ndim} axes", key=f"{self.block}.axis")
        return a

    def layer_setup(self, bottom, top):
        p = self.params
        shape = bottom[0].shape
        self.blobs = []
        if len(bottom) == 1:
            axis = self._axis(len(shape), p.num_axes)
            end = len(shape) if p.num_axes == -1 else axis + p.num_axes
            if end > len(shape):
                raise ShapeError(f"axis {p.axis} + num_axes {p.num_axes} exceeds the {len(shape)} axes of bottom "
                                 f"shape {shape}", key=f"{self.block}.num_axes")
            scale_shape = shape[axis:end]
            self.blobs.append(self.make_param(scale_shape, p.filler))
        else:
            scale_shape = bottom[1].shape
        if self.has_bias_term():
            self.blobs.append(self.make_param(scale_shape, p.bias_filler))

    def _scale(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        shape, s_shape = bottom[0].shape, self._scale(bottom).shape
        axis = self._axis(len(shape), len(s_shape))
        if shape[axis:axis + len(s_shape)] != s_shape:
            raise ShapeError(f"scale shape {s_shape} does not match bottom[0] shape {shape} at axes "
                             f"{axis}..{axis + len(s_shape) - 1}", key="bottom[1]" if len(bottom) > 1 else f"{self.block}.axis")
        self.axis = axis
        self.sum_axes = tuple(range(axis)) + tuple(range(axis + len(s_shape), len(shape)))
        self.trailing = (1,) * (len(shape) - axis - len(s_shape))
        self._scale_shape = s_shape
        top[0].reshape(shape)

    def _reduce(self, a):
        if not self.sum_axes:
            return a
        # (outer, scale, inner): the inner sum as a GEMV against ones (blas.row_sums)
        outer = math.prod(a.shape[:self.axis])
        inner = math.prod(self.trailing and a.shape[len(a.shape) - len(self.trailing):])
        size = a.size // (outer * inner)
        a = a.reshape(outer * size, inner)
        if inner > 1:
            a = row_sums(a)
        return a.reshape(outer, size).sum(axis=0).reshape(self._scale_shape)

    def _broadcast(self, a):
        return a.reshape(a.shape + self.trailing)

    def forward(self, bottom, top):
        x = bottom[0].data
        # in place, y overwrites x, which the scale gradient still needs
        xp = self.xp
        if bottom[0] is top[0]:
            if getattr(self, "x", None) is None or self.x.shape != x.shape:
                self.x = xp.empty_like(x)
            self._pieces(xp.copyto, self.x, x)
        else:
            self.x = None
        scale = self._broadcast(self._scale(bottom).data)
        bias = self._broadcast(self.blobs[-1].data) if self.has_bias_term() else None

        def affine(y, x):
            xp.multiply(x, scale, out=y)
            if bias is not None:
                y += bias
        self._pieces(affine, top[0].data, x)

    def backward(self, top, propagate_down, bottom):
        gy = top[0].diff
        if self.has_bias_term():
            self.blobs[-1].diff += self._reduce(gy)
        x = self.x if self.x is not None else bottom[0].data
        xp = self.xp
        if len(bottom) == 1 or propagate_down[1]:
            product = xp.empty_like(gy)
            self._pieces(lambda p, g, x: xp.multiply(g, x, out=p), product, gy, x)
            if len(bottom) == 1:
                self.blobs[0].diff += self._reduce(product)
            else:
                bottom[1].diff[...] = self._reduce(product)
        if propagate_down[0]:
            scale = self._broadcast(self._scale(bottom).data)
            self._pieces(lambda gx, g: xp.multiply(g, scale, out=gx), bottom[0].diff, gy)

    def _pieces(self, fn, *arrays):
        # the scale broadcasts along axis 0 unless it starts there: then the kernel threads split the batch
        if self.axis >= 1:
            elementwise(fn, *arrays)
        else:
            fn(*arrays)
