"""BN: batch normalisation with its own scale and shift (the BN layer of SegNet's and ENet's Caffe forks)."""
from ..errors import ShapeError
from ..kernels.batch_norm import batch_norm_backward, batch_stats, normalize
from .base import FILLER, Field, Layer, register_layer

EPS = 1e-9  # the forks' var_eps_, fixed


@register_layer("BN")
class BN(Layer):
    """y = s_c x_norm + b_c per channel c, learned s and b of shape (1, C, 1, 1).

    ``bn_mode: LEARN``: x_norm = (x - mean_c) / sqrt(var_c + 1e-9), the mean and biased variance of the
    batch over N, H and W; tops 1 and 2, when given, receive them (1, C, 1, 1) (SegNet's
    compute_bn_statistics.py averages them into the weights of an INFERENCE net). ``bn_mode: INFERENCE``:
    x_norm = x (the statistics are already folded into s and b). No running statistics are kept.
    Fillers: ``scale_filler`` and ``shift_filler``, each Caffe's default filler (constant 0) unless given.

    Gradients, sums and means over N, H, W: gs = sum(gy x_norm), gb = sum(gy); LEARN
    gx = s (gy - mean(gy) - mean(gy x_norm) x_norm) / sqrt(var + 1e-9), INFERENCE gx = s gy.
    """

    param_blocks = {"bn": {
        "bn_mode": Field("enum", "LEARN", choices=("LEARN", "INFERENCE"),
                         doc="LEARN: normalise with the batch's statistics; INFERENCE: only scale and shift"),
        "scale_filler": Field(FILLER, doc="initial scale (Caffe's default filler: constant 0)"),
        "shift_filler": Field(FILLER, doc="initial shift (Caffe's default filler: constant 0)"),
    }}
    num_top = (1, 3)
    backward_reads = ("bottom",)

    @classmethod
    def validate_params(cls, lp):
        if len(lp.top) > 1 and lp.bn.bn_mode != "LEARN":
            raise lp.error("the batch mean and variance tops need bn_mode LEARN", "top")

    def layer_setup(self, bottom, top):
        p = self.layer_param.bn
        if len(bottom[0].shape) != 4:
            raise ShapeError(f"BN needs a 4-D bottom (N, C, H, W), got shape {bottom[0].shape}", key="bottom")
        shape = (1, bottom[0].shape[1], 1, 1)
        self.blobs = [self.make_param(shape, p.scale_filler), self.make_param(shape, p.shift_filler)]

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4 or shape[1] != self.blobs[0].shape[1]:
            raise ShapeError(f"bottom shape {shape} does not fit the layer's {self.blobs[0].shape[1]} channels",
                             key="bottom")
        top[0].reshape(shape)
        for t in top[1:]:
            t.reshape(self.blobs[0].shape)

    def _view(self, a):
        return a.reshape(a.shape[0], a.shape[1], -1)

    def forward(self, bottom, top):
        xp = self.xp
        x = self._view(bottom[0].data)
        if self.layer_param.bn.bn_mode == "LEARN":
            mean, var = batch_stats(x)
            self.inv_std = 1 / xp.sqrt(var + EPS)
            self.x_norm = normalize(x, mean, self.inv_std, out=xp.empty(x.shape, dtype=x.dtype))
            for t, value in zip(top[1:], (mean, var)):
                t.data[...] = value.reshape(t.shape)
        else:
            self.x_norm = x
        scale, shift = (b.data.reshape(1, -1, 1) for b in self.blobs)
        self._view(top[0].data)[...] = self.x_norm * scale + shift

    def backward(self, top, propagate_down, bottom):
        gy = self._view(top[0].diff)
        x_norm = self.x_norm if self.layer_param.bn.bn_mode == "LEARN" else self._view(bottom[0].data)
        self.blobs[0].diff += (gy * x_norm).sum(axis=(0, 2)).reshape(self.blobs[0].shape)
        self.blobs[1].diff += gy.sum(axis=(0, 2)).reshape(self.blobs[1].shape)
        if not propagate_down[0]:
            return
        scale = self.blobs[0].data.reshape(-1)
        gx = self._view(bottom[0].diff)
        if self.layer_param.bn.bn_mode == "LEARN":
            batch_norm_backward(gy, x_norm, scale * self.inv_std, out=gx)
        else:
            gx[...] = gy * scale.reshape(1, -1, 1)
