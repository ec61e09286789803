"""Eltwise: element-wise product, weighted sum or maximum of bottoms of one shape (Caffe's EltwiseLayer)."""
from ..errors import ShapeError
from ..kernels.threadpool import elementwise, sum_into
from .base import Field, Layer, register_layer


@register_layer("Eltwise")
class Eltwise(Layer):
    """y = prod_k x_k (PROD), sum_k c_k x_k (SUM, c_k = ``coeff`` or 1) or max_k x_k (MAX); all shapes equal.

    Gradients: SUM gx_k = c_k gy; MAX routes gy to the bottom that won (ties as Caffe: between
    bottoms 0 and 1 the later one, after that the earlier winner stays); PROD gx_k = gy * prod_{j!=k} x_j
    with ``stable_prod_grad`` (exact even when some x_j is 0), else gy * y / x_k.

    A SUM of two bottoms with coefficients 1 followed by a ReLU in place on its top (ResNet's shortcut joins) runs
    fused with it, one pass each way, to the same bits (``layerforge.net.fusion``).
    """

    param_blocks = {"eltwise": {
        "operation": Field("enum", "SUM", choices=("PROD", "SUM", "MAX"), doc="element-wise operation"),
        "coeff": Field("floats", [], doc="SUM only: one weight per bottom"),
        "stable_prod_grad": Field("bool", True, doc="PROD: gradient as the product of the other bottoms, "
                                                    "not y / x_k"),
    }}
    num_bottom = (2, None)

    def __init__(self, layer_param, *args, **kw):
        super().__init__(layer_param, *args, **kw)
        p = layer_param.eltwise
        if p.operation != "PROD":
            self.backward_reads = ()
        elif p.stable_prod_grad:
            self.backward_reads = ("bottom",)

    @classmethod
    def validate_params(cls, lp):
        p = lp.eltwise
        if p.coeff and p.operation != "SUM":
            raise lp.error(f"coeff applies only to operation SUM, not {p.operation}", "eltwise.coeff")
        if p.coeff and len(p.coeff) != len(lp.bottom):
            raise lp.error(f"gives {len(p.coeff)} coefficients for {len(lp.bottom)} bottoms", "eltwise.coeff")
        if p.operation == "PROD" and lp.top and lp.top[0] in lp.bottom:
            raise lp.error("PROD cannot compute in place (its backward needs every bottom's data); "
                           f"give the top a name other than '{lp.top[0]}'", "top")

    def reshape(self, bottom, top):
        ref = bottom[0].shape
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != ref:
                raise ShapeError(f"bottom[{i}] shape {b.shape} differs from bottom[0] shape {ref}", key=f"bottom[{i}]")
        top[0].reshape(ref)

    def forward(self, bottom, top):
        xp = self.xp
        p = self.layer_param.eltwise
        xs = [b.data for b in bottom]
        if p.operation == "PROD":
            y = xs[0] * xs[1]
            for x in xs[2:]:
                y *= x
        elif p.operation == "SUM":
            coeff = p.coeff or [1.0] * len(xs)
            if all(c == 1 for c in coeff):  # straight into the top, no temporaries (ResNet's shortcuts)
                y = top[0].data
                if any(x is y for x in xs[1:]):
                    y = xp.empty_like(y)
                sum_into(y, *xs)
                if y is not top[0].data:
                    elementwise(xp.copyto, top[0].data, y)
                return
            y = xs[0] * coeff[0] if coeff[0] != 1 else xs[0].copy()
            for c, x in zip(coeff[1:], xs[1:]):
                y += x if c == 1 else c * x
        else:
            # Caffe's loop: bottom 1 wins ties with bottom 0, later bottoms must beat the running max
            y = xp.maximum(xs[0], xs[1])
            self.mask = (xs[0] <= xs[1]).astype(xp.int32)
            for k, x in enumerate(xs[2:], 2):
                won = x > y
                self.mask[won] = k
                y = xp.where(won, x, y)
        top[0].data[...] = y

    def backward(self, top, propagate_down, bottom):
        xp = self.xp
        p = self.layer_param.eltwise
        gy = top[0].diff
        if any(b is top[0] for b in bottom):
            gy = gy.copy()  # in place, writing bottom 0's diff would overwrite the top diff the others need
        for k, b in enumerate(bottom):
            if not propagate_down[k]:
                continue
            if p.operation == "SUM":
                c = p.coeff[k] if p.coeff else 1.0
                gx = gy if c == 1 else c * gy
            elif p.operation == "MAX":
                gx = xp.where(self.mask == k, gy, 0)
            elif p.stable_prod_grad:
                others = [o.data for j, o in enumerate(bottom) if j != k]
                gx = gy * others[0]
                for o in others[1:]:
                    gx = gx * o
            else:
                gx = gy * top[0].data / b.data
            elementwise(xp.copyto, b.diff, gx)
