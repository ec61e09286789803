"""InnerProduct (Caffe's fully connected layer)."""
import math

from ..errors import ShapeError
from ..kernels.blas import add_matmul, matmul, matmul_rows
from ..schema import REQUIRED
from .base import FILLER, Field, Layer, register_layer


@register_layer("InnerProduct")
class InnerProduct(Layer):
    """``y = x W^T + b`` over the bottom flattened from ``axis``.

    Shapes: bottom (d_0, ..., d_{axis-1}, d_axis, ...) is read as (M, K) with M = d_0 ... d_{axis-1} and
    K = d_axis ...; top is (d_0, ..., d_{axis-1}, N) with N = num_output. W is (N, K) as in Caffe, or
    (K, N) with ``transpose: true``; b is (N,). K is fixed at setup: later bottoms must keep it.
    """

    param_blocks = {"inner_product": {
        "num_output": Field("int", REQUIRED, min=1, doc="number of outputs (N)"),
        "bias_term": Field("bool", True, doc="learn a bias per output"),
        "weight_filler": Field(FILLER, doc="filler of W"),
        "bias_filler": Field(FILLER, doc="filler of b"),
        "axis": Field("int", 1, doc="first axis flattened into the inner product (negative counts from the end)"),
        "transpose": Field("bool", False, doc="store W as (K, N) instead of (N, K)"),
    }}
    backward_reads = ("bottom",)
    overwrites_param_diffs = (0,)  # gW written by one GEMM (beta = 0) when the net has not cleared it

    def _axis(self, shape):
        axis = self.layer_param.inner_product.axis
        if not -len(shape) <= axis < len(shape):
            raise ShapeError(f"axis {axis} is out of range for bottom shape {shape}", key="inner_product.axis")
        return axis % len(shape)

    def layer_setup(self, bottom, top):
        p = self.layer_param.inner_product
        self.num_output, self.bias_term, self.transpose = p.num_output, p.bias_term, p.transpose
        shape = bottom[0].shape
        k = math.prod(shape[self._axis(shape):])
        w_shape = (k, self.num_output) if self.transpose else (self.num_output, k)
        self.blobs = [self.make_param(w_shape, p.weight_filler)]
        if self.bias_term:
            self.blobs.append(self.make_param((self.num_output,), p.bias_filler))

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        axis = self._axis(shape)
        k = self.blobs[0].shape[0 if self.transpose else 1]
        m = math.prod(shape[:axis])
        if m * k != bottom[0].count:
            raise ShapeError(f"bottom shape {shape} flattens from axis {axis} to {bottom[0].count // max(m, 1)} "
                             f"inputs, the weights {self.blobs[0].shape} expect {k}", key="bottom")
        self.m, self.k = m, k
        top[0].reshape(shape[:axis] + (self.num_output,))

    def _weight_nk(self, a):
        return a.T if self.transpose else a

    def forward(self, bottom, top):
        y = top[0].data.reshape(self.m, self.num_output)
        matmul_rows(bottom[0].data.reshape(self.m, self.k), self._weight_nk(self.blobs[0].data).T, y)
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        gy = top[0].diff.reshape(self.m, self.num_output)
        x = bottom[0].data.reshape(self.m, self.k)
        a, b = (x.T, gy) if self.transpose else (gy.T, x)
        diff, overwrite = self.blobs[0].diff_to_overwrite()  # the net deferred its zeros: written, not added
        add_matmul(diff, a, b, overwrite=overwrite)
        if self.bias_term:
            self.blobs[1].diff += gy.sum(axis=0)
        if propagate_down[0]:
            matmul(gy, self._weight_nk(self.blobs[0].data), out=bottom[0].diff.reshape(self.m, self.k))

    def multiply_adds(self, bottom, top):
        return self.m * self.k * self.num_output
