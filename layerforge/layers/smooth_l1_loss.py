"""SmoothL1Loss: the box regression loss of the Fast R-CNN fork (rbgirshick/caffe-fast-rcnn) and the SSD fork."""
from ..errors import ShapeError
from .base import Field, register_layer
from .loss import LossLayer


@register_layer("SmoothL1Loss")
class SmoothL1Loss(LossLayer):
    """loss = sum(w_out * f(w_in * (a - b))) / N, N = a.shape[0], with

        f(x) = 0.5 (sigma x)^2          where |x| < 1 / sigma^2
               |x| - 0.5 / sigma^2      elsewhere.

    Bottoms: the predictions a (N, ...), the targets b, and optionally the inside weights w_in (the SSD fork's one
    weight bottom) and the outside weights w_out (Fast R-CNN's fourth bottom, py-faster-rcnn's
    ``bbox_outside_weights``); all hold a's number of values. ``smooth_l1_loss.sigma`` is Fast R-CNN's (its RPN
    uses 3); the SSD fork has none (sigma 1). Top: the scalar loss (shape ()).
    Backward: da = w w_out w_in f'(w_in (a - b)) / N and db = -da, w = top[0].diff (the loss weight), with
    f'(x) = sigma^2 x where |x| < 1 / sigma^2, else sign(x); the weights take no gradient. (The SSD fork's
    backward leaves the w_in factor out, which agrees where its weights are 0 or 1, as its users set them.)
    """

    num_bottom = (2, 4)
    label_bottom = 2  # a and b take a gradient, the weights do not
    backward_reads = ()  # forward keeps w_in (a - b)
    param_blocks = {"smooth_l1_loss": {
        "sigma": Field("float", 1.0, min=0.0, doc="the quadratic part spans |x| < 1 / sigma^2 (Fast R-CNN's RPN: 3)"),
    }}

    @classmethod
    def validate_params(cls, lp):
        if lp.smooth_l1_loss.sigma <= 0:
            raise lp.error(f"must be above 0, got {lp.smooth_l1_loss.sigma}", "smooth_l1_loss.sigma")

    def layer_setup(self, bottom, top):
        self.sigma2 = self.layer_param.smooth_l1_loss.sigma ** 2

    def reshape(self, bottom, top):
        a = bottom[0].shape
        for i, b in enumerate(bottom[1:], 1):
            if b.count != bottom[0].count or b.shape[:1] != a[:1]:
                raise ShapeError(f"bottom {i} has shape {b.shape}; it must hold the predictions' {bottom[0].count} "
                                 f"values of {a[0] if a else 1} items (shape {a})", key="bottom")
        self.num = a[0] if a else 1
        top[0].reshape(())

    def forward(self, bottom, top):
        xp = self.xp
        d = bottom[0].data - bottom[1].data.reshape(bottom[0].shape)
        if len(bottom) > 2:
            d = d * bottom[2].data.reshape(d.shape)
        self.diff = d
        ad = xp.abs(d)
        errors = xp.where(ad < 1.0 / self.sigma2, 0.5 * self.sigma2 * d * d, ad - 0.5 / self.sigma2)
        if len(bottom) > 3:
            errors = errors * bottom[3].data.reshape(d.shape)
        top[0].data[...] = errors.sum() / self.num

    def backward(self, top, propagate_down, bottom):
        self.refuse_label_gradient(propagate_down)
        if not (propagate_down[0] or propagate_down[1]):
            return
        xp, d = self.xp, self.diff
        grad = xp.where(xp.abs(d) < 1.0 / self.sigma2, self.sigma2 * d, xp.sign(d))
        for weights in bottom[2:]:
            grad = grad * weights.data.reshape(d.shape)
        grad = grad * (top[0].diff.reshape(-1)[0] / self.num)
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                bottom[i].diff[...] = (sign * grad).reshape(bottom[i].shape)
