"""Normalize: L2 normalisation with a learned scale (SSD's NormalizeLayer, weiliu89/caffe branch ssd)."""
from ..errors import ShapeError
from ..schema import Context, validate_block
from .base import FILLER, Field, Layer, register_layer

_ONE = validate_block({"type": "CONSTANT", "value": 1.0}, FILLER, Context())


@register_layer("Normalize")
class Normalize(Layer):
    """y = s * x / ||x||, the norm taken per image over (C, H, W) (``across_spatial``) or per position over C.

    ``||x|| = sqrt(sum x^2 + eps)`` (eps inside the root, as the fork). s is one learned scale
    (``channel_shared``, blob shape ()) or one per channel (C,), filled by ``scale_filler`` (default 1).
    Shapes: x (N, C, ...) -> y the same. Gradients, with n = ||x|| and sums over the normalised axes:
    gs = sum(gy * x / n), and for x the fork's (normalize_layer.cpp / .cu Backward):

        gx = s * (gy - x sum(gy x) / n^2) / n

    which leaves s out of the inner sum. With one scale (``channel_shared``) or equal ones that is the true
    gradient; with unequal per-channel scales it is not, and SSD's hyper-parameters were tuned on it, so it
    is the default. ``exact_gradient: true`` (a layerforge key) gives the true gradient of the forward,
    gx = (s gy - x sum(s gy x) / n^2) / n.
    """

    param_blocks = {"norm": {
        "across_spatial": Field("bool", True, doc="one norm per image over (C, H, W); false: per position over C"),
        "scale_filler": Field(FILLER, _ONE, doc="initial scale (default constant 1)"),
        "channel_shared": Field("bool", True, doc="one scale for all channels; false: one per channel"),
        "eps": Field("float", 1e-10, min=0.0, doc="added to the sum of squares under the root"),
        "exact_gradient": Field("bool", False, doc="layerforge: the true bottom gradient (default: the fork's, "
                                                   "s left out of the inner sum)"),
    }}
    backward_reads = ("bottom",)

    def layer_setup(self, bottom, top):
        p = self.layer_param.norm
        if len(bottom[0].shape) < 2:
            raise ShapeError(f"Normalize needs a bottom of 2 or more axes (N, C, ...), got shape {bottom[0].shape}",
                             key="bottom")
        self.blobs = [self.make_param(() if p.channel_shared else (bottom[0].shape[1],), p.scale_filler)]

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) < 2 or (not self.layer_param.norm.channel_shared and shape[1] != self.blobs[0].shape[0]):
            raise ShapeError(f"bottom shape {shape} does not fit the layer's {self.blobs[0].shape[0]} channel scales",
                             key="bottom")
        # (N, C, S): the norm sums axes 1 and 2, or axis 1 only
        self.sum_axes = (1, 2) if self.layer_param.norm.across_spatial else (1,)
        top[0].reshape(shape)

    def _view(self, a):
        return a.reshape(a.shape[0], a.shape[1], -1)

    def _scale(self):
        s = self.blobs[0].data
        return s if s.ndim == 0 else s.reshape(1, -1, 1)

    def forward(self, bottom, top):
        x = self._view(bottom[0].data)
        self.norm = self.xp.sqrt((x * x).sum(axis=self.sum_axes, keepdims=True) + self.layer_param.norm.eps)
        self._view(top[0].data)[...] = x / self.norm * self._scale()

    def backward(self, top, propagate_down, bottom):
        x, gy = self._view(bottom[0].data), self._view(top[0].diff)
        x_hat = x / self.norm
        gs = gy * x_hat
        self.blobs[0].diff += gs.sum() if self.blobs[0].data.ndim == 0 else gs.sum(axis=(0, 2))
        if propagate_down[0]:
            s, exact = self._scale(), self.layer_param.norm.exact_gradient
            g = gy * s if exact else gy  # the fork scales after the projection, not before
            gx = (g - x_hat * (g * x_hat).sum(axis=self.sum_axes, keepdims=True)) / self.norm
            self._view(bottom[0].diff)[...] = gx if exact else gx * s
