"""Pooling (Caffe's PoolingLayer): MAX and AVE with Caffe's ceil-mode output size."""
from .. import rng
from ..errors import ShapeError
from ..kernels import pooling as kernels
from ..kernels.output_size import pooling_output_size
from .base import Field, Layer, register_layer
from .layer_param import read_pair


@register_layer("Pooling")
class Pooling(Layer):
    """Max or average over kh x kw windows taken every (sy, sx) over the zero-padded bottom.

    Shapes: bottom (N, C, H, W) -> top (N, C, Hout, Wout) with Caffe's
    ``Hout = ceil((H + 2 ph - kh) / sy) + 1`` (``round_mode: FLOOR`` takes the floor), minus one when the
    last window would start in the bottom padding; a kernel larger than the bottom gives Caffe's shape too
    (its windows clipped to the bottom), an error only where the formula leaves no output. MAX ignores padding; a second top receives Caffe's
    mask, the flat index ``h * W + w`` of each maximum. AVE sums the window and divides by its size
    clipped to the padded image (so padding counts). ``global_pooling`` takes the whole H x W plane.
    STOCHASTIC (no padding; Caffe's stochastic pooling) outputs in TRAIN one element of each window, drawn
    with probability proportional to its value (inputs are non-negative, e.g. after a ReLU), and routes
    the gradient to it; in TEST the probability-weighted mean sum(x^2) / sum(x).
    """

    param_blocks = {"pooling": {
        "pool": Field("enum", "MAX", choices=("MAX", "AVE", "STOCHASTIC"),
                      doc="MAX, AVE, or STOCHASTIC (a value drawn in proportion to its size; TEST: weighted mean)"),
        "pad": Field("int", 0, min=0, doc="padding on each side"),
        "pad_h": Field("int", 0, min=0), "pad_w": Field("int", 0, min=0),
        "kernel_size": Field("int", None, min=1, doc="square window size"),
        "kernel_h": Field("int", None, min=1), "kernel_w": Field("int", None, min=1),
        "stride": Field("int", 1, min=1, doc="step between windows"),
        "stride_h": Field("int", None, min=1), "stride_w": Field("int", None, min=1),
        "global_pooling": Field("bool", False, doc="pool each whole plane to 1 x 1"),
        "round_mode": Field("enum", "CEIL", choices=("CEIL", "FLOOR"), doc="rounding of the output size"),
    }}
    num_top = (1, 2)
    backward_reads = ()

    @classmethod
    def validate_params(cls, lp):
        p = lp.pooling
        if p.pool == "STOCHASTIC" and (p.pad or p.pad_h or p.pad_w):
            raise lp.error("STOCHASTIC pooling takes no padding (Caffe implements padding for MAX and AVE only)",
                           "pooling.pad")
        if len(lp.top) > 1 and p.pool != "MAX":
            raise lp.error(f"only MAX pooling has a second (mask) top; pool is {p.pool}", "top")
        cls.read_geometry(lp)

    @staticmethod
    def read_geometry(lp):
        """``(kh, kw, sy, sx, ph, pw)``; kh and kw are None with ``global_pooling`` (the bottom decides)."""
        p = lp.pooling
        (ph, pw), (sy, sx) = read_pair(lp, "pooling", "pad", 0), read_pair(lp, "pooling", "stride", 1)
        if p.global_pooling:
            for key in ("kernel_size", "kernel_h", "kernel_w"):
                if p.given(key):
                    raise lp.error("global_pooling takes the whole plane; give no kernel size", f"pooling.{key}")
            if (ph, pw, sy, sx) != (0, 0, 1, 1):
                raise lp.error("global_pooling needs pad 0 and stride 1", "pooling.global_pooling")
            return None, None, 1, 1, 0, 0
        kh, kw = read_pair(lp, "pooling", "kernel_size")
        if ph >= kh or pw >= kw:
            raise lp.error(f"pad {ph}x{pw} must be smaller than the kernel {kh}x{kw}", "pooling.pad")
        return kh, kw, sy, sx, ph, pw

    def layer_setup(self, bottom, top):
        self.pool = self.layer_param.pooling.pool
        self.ceil_mode = self.layer_param.pooling.round_mode == "CEIL"
        self.kh, self.kw, self.sy, self.sx, self.ph, self.pw = self.read_geometry(self.layer_param)
        self.global_pooling = self.kh is None
        self.argmax = None
        self.capturable = not (self.pool == "STOCHASTIC" and self.phase == "TRAIN")  # host-drawn choices

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4:
            raise ShapeError(f"Pooling needs a 4-D bottom (N, C, H, W), got shape {shape}", key="bottom")
        if self.global_pooling:
            self.kh, self.kw = shape[2:]
        padded = self.ph > 0 or self.pw > 0  # Caffe clips both axes' last windows when either is padded
        self.out_h = pooling_output_size(shape[2], self.kh, self.sy, self.ph, self.ceil_mode, padded)
        self.out_w = pooling_output_size(shape[3], self.kw, self.sx, self.pw, self.ceil_mode, padded)
        # a kernel larger than the bottom is no error in Caffe (OpenPose builds a 1x1 placeholder net first): the
        # formula gives one window clipped to the bottom; only a formula giving no window at all is refused
        if self.out_h < 1 or self.out_w < 1:
            raise ShapeError(f"kernel {self.kh}x{self.kw} (pad {self.ph}x{self.pw}, stride {self.sy}x{self.sx}, "
                             f"{self.layer_param.pooling.round_mode} rounding) leaves no output for bottom shape "
                             f"{shape}", key="pooling.kernel_size")
        for t in top:
            t.reshape(shape[0], shape[1], self.out_h, self.out_w)

    def _geometry(self):
        return self.kh, self.kw, self.sy, self.sx, self.ph, self.pw

    def forward(self, bottom, top):
        x = bottom[0].data
        if self.pool == "MAX":
            _, self.argmax = kernels.max_pooling_forward(x, *self._geometry(), self.out_h, self.out_w,
                                                         out=top[0].data)
            if len(top) > 1:
                top[1].data[...] = kernels.argmax_to_mask(self.argmax, x.shape, self.kw, self.sy, self.sx,
                                                          self.ph, self.pw)
        elif self.pool == "STOCHASTIC":
            uniform = None
            if self.phase == "TRAIN":
                uniform = self.xp.asarray(rng.get_rng().random((x.shape[0], x.shape[1], self.out_h, self.out_w)),
                                          dtype=x.dtype)
            _, self.argmax = kernels.stochastic_pooling_forward(x, self.kh, self.kw, self.sy, self.sx, self.out_h,
                                                                self.out_w, uniform, out=top[0].data)
        else:
            kernels.average_pooling_forward(x, *self._geometry(), self.out_h, self.out_w, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        gy = top[0].diff
        if self.pool == "STOCHASTIC" and self.argmax is None:
            raise self.layer_param.error("STOCHASTIC pooling has a gradient in TRAIN only (TEST takes a weighted "
                                         "mean, as Caffe, which has no backward)", "pooling.pool")
        if self.pool in ("MAX", "STOCHASTIC"):  # the drawn element takes the gradient, as max pooling's winner
            kernels.max_pooling_backward(gy, self.argmax, bottom[0].shape, *self._geometry(), out=bottom[0].diff)
        else:
            kernels.average_pooling_backward(gy, bottom[0].shape, *self._geometry(), out=bottom[0].diff)
