"""Convolution (Caffe's ConvolutionLayer): 2-D, grouped, dilated, by explicit im2col + GEMM."""
from ..backend import get_array_module
from ..errors import ShapeError
from ..kernels.im2col import col2im, conv_output_size, im2col
from ..schema import REQUIRED
from .base import FILLER, Field, Layer, register_layer


def read_pair(lp, block, name, default=None):
    """``(h, w)`` of a 2-D option written as ``name`` (one value or ``[h, w]``) or as ``<key>_h`` + ``<key>_w``.

    ``<key>`` is ``kernel`` for ``kernel_size``, else ``name``. ``default`` (None: required) applies when
    neither form is given. Raises the layer's ConfigError for mixed or incomplete forms, as Caffe does.
    """
    p = getattr(lp, block)
    key = "kernel" if name == "kernel_size" else name
    kh, kw = f"{key}_h", f"{key}_w"
    if p.given(kh) or p.given(kw):
        if p.given(name):
            raise lp.error(f"give either {name} or {kh}/{kw}, not both", f"{block}.{kh}")
        if not (p.given(kh) and p.given(kw)):
            raise lp.error(f"give both {kh} and {kw}", f"{block}.{kh if not p.given(kh) else kw}")
        return getattr(p, kh), getattr(p, kw)
    values = getattr(p, name)
    values = values if isinstance(values, list) else ([] if values is None else [values])
    if not values:
        if default is None:
            raise lp.error(f"required: {name}, or {kh} and {kw}", f"{block}.{name}")
        return default, default
    if len(values) > 2:
        raise lp.error(f"expected one value or [h, w] (2-D only), got {len(values)} values", f"{block}.{name}")
    return values[0], values[-1]


def _im2col_forward(layer, x):
    xp = get_array_module(x)
    n, c, h, w = x.shape
    g, (kh, kw, sy, sx, ph, pw, dy, dx) = layer.group, layer.geometry
    col = im2col(x, kh, kw, sy, sx, ph, pw, dy, dx)
    out_h, out_w = col.shape[4:]
    W = layer.blobs[0].data.reshape(g, layer.num_output // g, -1)
    y = xp.matmul(W, col.reshape(g, W.shape[2], n * out_h * out_w))
    return y.reshape(layer.num_output, n, out_h, out_w).transpose(1, 0, 2, 3)


def _im2col_backward(layer, x, gy, need_gx):
    # Caffe recomputes the columns rather than keeping a buffer per bottom alive between passes.
    xp = get_array_module(x)
    n, c, h, w = x.shape
    g, (kh, kw, sy, sx, ph, pw, dy, dx) = layer.group, layer.geometry
    out_h, out_w = gy.shape[2:]
    col = im2col(x, kh, kw, sy, sx, ph, pw, dy, dx).reshape(g, -1, n * out_h * out_w)
    gy_t = xp.ascontiguousarray(gy.transpose(1, 0, 2, 3)).reshape(g, layer.num_output // g, -1)
    gW = xp.matmul(gy_t, col.transpose(0, 2, 1))
    gx = None
    if need_gx:
        W = layer.blobs[0].data.reshape(g, layer.num_output // g, -1)
        gcol = xp.matmul(W.transpose(0, 2, 1), gy_t).reshape(c, kh, kw, n, out_h, out_w)
        gx = col2im(gcol, sy, sx, ph, pw, h, w, dy, dx)
    return gW, gx


# engine -> (forward(layer, x) -> y without bias, backward(layer, x, gy, need_gx) -> (gW, gx or None));
# "DEFAULT" in the config means DEFAULT_ENGINE.
ENGINES = {"IM2COL": (_im2col_forward, _im2col_backward)}
DEFAULT_ENGINE = "IM2COL"


@register_layer("Convolution")
class Convolution(Layer):
    """2-D convolution (cross-correlation, as Caffe) of each bottom with shared filters.

    ``y[n, o, i, j] = b[o] + sum_{c, p, q} W[o, c, p, q] x[n, g(o) Cin/G + c, i sy - ph + p dy, j sx - pw + q dx]``
    with zero padding, where group ``g(o) = o // (Cout / G)`` sees only its Cin / G input channels.

    Shapes: bottom (N, Cin, H, W) -> top (N, Cout, Hout, Wout), ``Hout = (H + 2 ph - (dy (kh - 1) + 1)) // sy + 1``.
    Parameters: W (Cout, Cin / G, kh, kw), b (Cout,) when ``bias_term``. Several bottoms (each with its own
    top) share the parameters. The IM2COL engine runs one GEMM per group for the whole minibatch.
    """

    param_blocks = {"convolution": {
        "num_output": Field("int", REQUIRED, min=1, doc="number of filters (Cout)"),
        "bias_term": Field("bool", True, doc="learn a bias per output channel"),
        "pad": Field("ints", [], min=0, doc="zero padding: one value or [h, w] (default 0)"),
        "kernel_size": Field("ints", [], min=1, doc="kernel size: one value or [h, w]"),
        "stride": Field("ints", [], min=1, doc="stride: one value or [h, w] (default 1)"),
        "dilation": Field("ints", [], min=1, doc="dilation: one value or [h, w] (default 1)"),
        "pad_h": Field("int", 0, min=0), "pad_w": Field("int", 0, min=0),
        "kernel_h": Field("int", None, min=1), "kernel_w": Field("int", None, min=1),
        "stride_h": Field("int", None, min=1), "stride_w": Field("int", None, min=1),
        "group": Field("int", 1, min=1, doc="split channels and filters into this many independent groups"),
        "weight_filler": Field(FILLER, doc="filler of W"),
        "bias_filler": Field(FILLER, doc="filler of b"),
        "engine": Field("enum", "DEFAULT", choices=("DEFAULT", "IM2COL"), doc="implementation (DEFAULT: IM2COL)"),
    }}
    num_bottom = (1, None)
    num_top = (1, None)
    backward_reads = ("bottom",)

    @classmethod
    def validate_params(cls, lp):
        p = lp.convolution
        if len(lp.bottom) != len(lp.top):
            raise lp.error(f"needs one top per bottom, got {len(lp.bottom)} bottoms and {len(lp.top)} tops", "top")
        if p.num_output % p.group:
            raise lp.error(f"num_output {p.num_output} is not divisible by group {p.group}", "convolution.group")
        cls.read_geometry(lp)

    @staticmethod
    def read_geometry(lp):
        (kh, kw), (sy, sx) = read_pair(lp, "convolution", "kernel_size"), read_pair(lp, "convolution", "stride", 1)
        (ph, pw), (dy, dx) = read_pair(lp, "convolution", "pad", 0), read_pair(lp, "convolution", "dilation", 1)
        return kh, kw, sy, sx, ph, pw, dy, dx

    def layer_setup(self, bottom, top):
        p = self.layer_param.convolution
        self.num_output, self.group, self.bias_term = p.num_output, p.group, p.bias_term
        self.geometry = self.read_geometry(self.layer_param)
        engine = DEFAULT_ENGINE if p.engine == "DEFAULT" else p.engine
        self._forward, self._backward = ENGINES[engine]
        channels = self._check_bottom(bottom[0])
        kh, kw = self.geometry[:2]
        self.blobs = [self.make_param((self.num_output, channels // self.group, kh, kw), p.weight_filler)]
        if self.bias_term:
            self.blobs.append(self.make_param((self.num_output,), p.bias_filler))

    def _check_bottom(self, b):
        if len(b.shape) != 4:
            raise ShapeError(f"Convolution needs a 4-D bottom (N, C, H, W), got shape {b.shape}", key="bottom")
        if b.shape[1] % self.group:
            raise ShapeError(f"bottom channels {b.shape[1]} (shape {b.shape}) are not divisible by group {self.group}",
                             key="convolution.group")
        return b.shape[1]

    def reshape(self, bottom, top):
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        first = bottom[0].shape
        for b, t in zip(bottom, top):
            self._check_bottom(b)
            if b.shape != first:
                raise ShapeError(f"all bottoms need one shape, got {first} and {b.shape}", key="bottom")
            channels = self.blobs[0].shape[1] * self.group
            if b.shape[1] != channels:
                raise ShapeError(f"bottom shape {b.shape} has {b.shape[1]} channels, the weights "
                                 f"{self.blobs[0].shape} (group {self.group}) expect {channels}", key="bottom")
            out_h = conv_output_size(b.shape[2], kh, sy, ph, dy)
            out_w = conv_output_size(b.shape[3], kw, sx, pw, dx)
            if out_h < 1 or out_w < 1:
                raise ShapeError(f"kernel {kh}x{kw} (dilation {dy}x{dx}, pad {ph}x{pw}) does not fit bottom shape "
                                 f"{b.shape}", key="convolution.kernel_size")
            t.reshape(b.shape[0], self.num_output, out_h, out_w)

    def forward(self, bottom, top):
        for b, t in zip(bottom, top):
            t.data[...] = self._forward(self, b.data)
            if self.bias_term:
                t.data += self.blobs[1].data[:, None, None]

    def backward(self, top, propagate_down, bottom):
        for i, (b, t) in enumerate(zip(bottom, top)):
            gW, gx = self._backward(self, b.data, t.diff, propagate_down[i])
            self.blobs[0].diff += gW.reshape(self.blobs[0].shape)
            if self.bias_term:
                self.blobs[1].diff += t.diff.sum(axis=(0, 2, 3))
            if propagate_down[i]:
                b.diff[...] = gx

    def multiply_adds(self, bottom, top):
        kh, kw = self.geometry[:2]
        cin_g = self.blobs[0].shape[1]
        return sum(t.shape[0] * self.num_output * t.shape[2] * t.shape[3] * cin_g * kh * kw for t in top)
