"""Convolution (Caffe's ConvolutionLayer): 2-D or N-d, grouped, dilated; explicit im2col or implicit GEMM, autotuned."""
from ..errors import ShapeError
from ..kernels.output_size import conv_output_size
from ..kernels import winograd
from ..kernels.autotune import ENGINE_CHOICES, WINOGRAD_ENGINES, WINOGRAD_TILES, ConvEngines
from ..kernels.implicit_gemm import NdIm2colConv
from ..schema import REQUIRED
from .base import FILLER, Field, Layer, register_layer
from .layer_param import canonical_axis, read_pair


@register_layer("Convolution")
class Convolution(Layer):
    """Convolution (cross-correlation, as Caffe) of each bottom with shared filters, 2-D or over any number of axes.

    ``y[n, o, i, j] = b[o] + sum_{c, p, q} W[o, c, p, q] x[n, g(o) Cin/G + c, i sy - ph + p dy, j sx - pw + q dx]``
    with zero padding, where group ``g(o) = o // (Cout / G)`` sees only its Cin / G input channels.

    Shapes: bottom (N, Cin, H, W) -> top (N, Cout, Hout, Wout), ``Hout = (H + 2 ph - (dy (kh - 1) + 1)) // sy + 1``.
    Parameters: W (Cout, Cin / G, kh, kw), b (Cout,) when ``bias_term``. Several bottoms (each with its own
    top) share the parameters. Engines (``layerforge.kernels.implicit_gemm``): IM2COL runs one GEMM per
    group for the whole minibatch over a full column buffer; IMPLICIT lowers bounded tiles; AUTO times
    both over the first calls, separately for forward and backward, and keeps the faster
    (``engine_choice``; logged on the "layerforge" logger), except that it does not try IM2COL where
    the full column buffer would exceed ``AUTO_WORKSPACE_LIMIT``, and that a Winograd engine whose forward
    keeps its tiles and transformed filters for its backward runs both ways where that is faster. Snapshots and
    the on-disk engine cache (``layerforge.kernels.engine_cache``) keep AUTO's choices, so a resumed run or a second
    start does not time again.
    The layer holds its engines, their timing and AUTO's choice in ``engines`` (``kernels.autotune.ConvEngines``).

    N-d (Caffe's N-d path): with ``axis`` the channel axis, the axes before it are batch axes and the D
    axes after it spatial; kernel_size / stride / pad / dilation take one value or D (and the 2-D forms
    kernel_h/kernel_w... where D is 2). Anything but a 4-D bottom with axis 1, or ``force_nd_im2col``, runs
    the N-d column engine (IM2COL_ND): bottom (*B, Cin, *S) -> top (*B, Cout, *Sout), W (Cout, Cin / G, *kernel).
    D may be 0 (the channel axis last, as Caffe allows): then ``y[..., o] = b[o] + sum_c W[o, c] x[..., c]``
    within each group, a product mixing the channels at every position; W is (Cout, Cin / G) and any
    kernel_size given is ignored, as in Caffe.
    """

    param_blocks = {"convolution": {
        "num_output": Field("int", REQUIRED, min=1, doc="number of filters (Cout)"),
        "bias_term": Field("bool", True, doc="learn a bias per output channel"),
        "pad": Field("ints", [], min=0, doc="zero padding: one value or one per spatial axis (default 0)"),
        "kernel_size": Field("ints", [], min=1, doc="kernel size: one value or one per spatial axis"),
        "stride": Field("ints", [], min=1, doc="stride: one value or one per spatial axis (default 1)"),
        "dilation": Field("ints", [], min=1, doc="dilation: one value or one per spatial axis (default 1)"),
        "pad_h": Field("int", 0, min=0), "pad_w": Field("int", 0, min=0),
        "kernel_h": Field("int", None, min=1), "kernel_w": Field("int", None, min=1),
        "stride_h": Field("int", None, min=1), "stride_w": Field("int", None, min=1),
        "group": Field("int", 1, min=1, doc="split channels and filters into this many independent groups"),
        "weight_filler": Field(FILLER, doc="filler of W"),
        "bias_filler": Field(FILLER, doc="filler of b"),
        "engine": Field("enum", "AUTO", choices=tuple(ENGINE_CHOICES),
                        doc="IM2COL (full column buffer), IMPLICIT (bounded tiles), WINOGRAD (F(4x4,3x3): 3x3 at "
                            "stride 1, or a kernel spanning 3x3 strides such as 11x11 at stride 4, over space-to-depth "
                            "blocks) or WINOGRAD_F2 (F(2x2,3x3) or F(2x2,5x5): 3x3 or 5x5, or spanning as many "
                            "strides), or AUTO/DEFAULT (time IM2COL, "
                            "IMPLICIT and, where they apply, both WINOGRAD engines; keep the fastest per direction, "
                            "or a WINOGRAD engine both ways where the tiles its forward keeps make that faster)"),
        "axis": Field("int", 1, doc="the channel axis; axes before it are batch axes, the axes after it spatial"),
        "force_nd_im2col": Field("bool", False, doc="use the N-d column path even for 2 spatial axes"),
    }}
    num_bottom = (1, None)
    num_top = (1, None)
    backward_reads = ("bottom",)
    adds_bottom_diffs = True  # every engine's backward can add its data gradient (kernels/implicit_gemm.py)

    @classmethod
    def validate_params(cls, lp):
        p = lp.convolution
        if len(lp.bottom) != len(lp.top):
            raise lp.error(f"needs one top per bottom, got {len(lp.bottom)} bottoms and {len(lp.top)} tops", "top")
        if p.num_output and p.num_output % p.group:
            raise lp.error(f"num_output {p.num_output} is not divisible by group {p.group}", "convolution.group")
        # with no kernel at all, only a bottom without spatial axes is valid (Caffe's 0-D case): setup decides
        kernel_given = p.kernel_size or p.given("kernel_h") or p.given("kernel_w")
        if not cls.wants_nd(lp) and kernel_given:
            geometry = cls.read_geometry(lp)
            if p.engine in WINOGRAD_ENGINES and not winograd.eligible(geometry, WINOGRAD_TILES[p.engine]):
                sizes = " or ".join(f"{r}x{r}" for r in winograd.kernel_sizes(WINOGRAD_TILES[p.engine]))
                raise lp.error(f"engine {p.engine} runs undilated convolutions whose kernel spans {sizes} strides "
                               f"({sizes} at stride 1, or such as 11x11 at stride 4) only; this layer has kernel "
                               f"{geometry[0]}x{geometry[1]}, stride {geometry[2]}x{geometry[3]}, dilation {geometry[6]}x{geometry[7]}: use AUTO, IM2COL or IMPLICIT",
                               "convolution.engine")
        elif p.engine in WINOGRAD_ENGINES:
            raise lp.error(f"engine {p.engine} runs 2-D convolutions only (this layer takes the N-d path)",
                           "convolution.engine")

    @staticmethod
    def wants_nd(lp):
        """Whether the layer's parameters ask for the N-d path (more than 2 values, force_nd_im2col, axis != 1)."""
        p = lp.convolution
        return p.force_nd_im2col or p.axis != 1 or any(len(getattr(p, k)) > 2 for k in
                                                       ("kernel_size", "stride", "pad", "dilation"))

    @classmethod
    def read_geometry_nd(cls, lp, axes):
        """``(kernel, stride, pad, dilation)``, each a tuple of ``axes`` values (one value repeats, Caffe's rule).

        With 2 spatial axes the 2-D forms (``kernel_h``/``kernel_w``, ``stride_h``/``stride_w``,
        ``pad_h``/``pad_w``) apply as on the 2-D path; with 0 (the channel axis last) every tuple is empty.
        """
        p = lp.convolution
        split = [k for k in ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w") if p.given(k)]
        if axes == 2 and split:
            kh, kw, sy, sx, ph, pw, dy, dx = cls.read_geometry(lp)
            return (kh, kw), (sy, sx), (ph, pw), (dy, dx)
        if split:
            raise lp.error(f"{split[0]} is for 2-D convolutions (this bottom has {axes} spatial axes); give "
                           f"kernel_size/stride/pad with one value per axis", f"convolution.{split[0]}")
        out = []
        for key, default in (("kernel_size", None), ("stride", 1), ("pad", 0), ("dilation", 1)):
            values = list(getattr(p, key)) or ([] if default is None else [default])
            if len(values) == 1:
                values = values * axes
            if len(values) != axes:
                raise lp.error(f"{key} has {len(values)} values for {axes} spatial axes (give 1 or {axes})",
                               f"convolution.{key}")
            out.append(tuple(values))
        return tuple(out)

    @staticmethod
    def read_geometry(lp):
        (kh, kw), (sy, sx) = read_pair(lp, "convolution", "kernel_size"), read_pair(lp, "convolution", "stride", 1)
        (ph, pw), (dy, dx) = read_pair(lp, "convolution", "pad", 0), read_pair(lp, "convolution", "dilation", 1)
        return kh, kw, sy, sx, ph, pw, dy, dx

    def layer_setup(self, bottom, top):
        p = self.layer_param.convolution
        self.num_output, self.group, self.bias_term = p.num_output, p.group, p.bias_term
        self.engine = "AUTO" if p.engine == "DEFAULT" else p.engine
        shape = bottom[0].shape
        self.axis = canonical_axis(p.axis, len(shape), "convolution.axis")
        self.nd = self.wants_nd(self.layer_param) or len(shape) - self.axis - 1 != 2
        if self.nd:  # Caffe's N-d path: any number of spatial axes after the channel axis, 0 included
            self.geometry = self.read_geometry_nd(self.layer_param, len(shape) - self.axis - 1)
            channels, kernel = self._check_channels(shape), self.geometry[0]
        else:
            self.geometry = self.read_geometry(self.layer_param)
            channels, kernel = self._check_bottom(bottom[0]), self.geometry[:2]
        self.engines = ConvEngines(self.type, self.name, self.engine, self.geometry, self.group)
        self.blobs = [self.make_param((self.num_output, channels // self.group) + tuple(kernel), p.weight_filler)]
        if self.bias_term:
            self.blobs.append(self.make_param((self.num_output,), p.bias_filler))

    def _check_channels(self, shape):
        if shape[self.axis] % self.group:
            raise ShapeError(f"bottom channels {shape[self.axis]} (shape {shape}, axis {self.axis}) are not divisible "
                             f"by group {self.group}", key="convolution.group")
        return shape[self.axis]

    def _flat(self, a):
        """An N-d blob array as (batch, C, *spatial): the axes before the channel axis merged."""
        return a.reshape((-1,) + a.shape[self.axis:]) if self.nd else a

    def _reshape_nd(self, bottom, top, out_shape):
        """Tops for the N-d path: ``out_shape(spatial) -> spatial out``; the N-d engine in place of AUTO's."""
        first = bottom[0].shape
        for b, t in zip(bottom, top):
            if b.shape != first:
                raise ShapeError(f"all bottoms need one shape, got {first} and {b.shape}", key="bottom")
            self._check_weight_channels(b.shape, b.shape[self.axis])
            out = out_shape(b.shape[self.axis + 1:])
            if any(size < 1 for size in out):
                raise ShapeError(f"the kernel does not fit bottom shape {b.shape}", key="convolution.kernel_size")
            t.reshape(tuple(b.shape[:self.axis]) + (self.num_output,) + tuple(out))
        if not self.engines:
            self.engines.use("IM2COL_ND", NdIm2colConv(self.geometry, self.group))

    def bottom_channels(self):
        """The bottom channel count the weights were made for."""
        return self.blobs[0].shape[1] * self.group

    def _check_weight_channels(self, shape, channels):
        if channels != self.bottom_channels():
            raise ShapeError(f"bottom shape {shape} has {channels} channels, the weights {self.blobs[0].shape} "
                             f"(group {self.group}) expect {self.bottom_channels()}", key="bottom")

    def _check_bottom(self, b):
        if len(b.shape) != 4:
            raise ShapeError(f"Convolution needs a 4-D bottom (N, C, H, W), got shape {b.shape}", key="bottom")
        if b.shape[1] % self.group:
            raise ShapeError(f"bottom channels {b.shape[1]} (shape {b.shape}) are not divisible by group {self.group}",
                             key="convolution.group")
        return b.shape[1]

    # the output extent along one axis, (size, k, s, p, d) -> out; Deconvolution transposes it
    output_size = staticmethod(conv_output_size)

    def _no_output(self, shape):
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        return ShapeError(f"kernel {kh}x{kw} (dilation {dy}x{dx}, pad {ph}x{pw}) does not fit bottom shape {shape}",
                          key="convolution.kernel_size")

    def _engine_shapes(self, bottom_shape, top_shape):
        """The (input, output) shapes of the convolution the engines run."""
        return bottom_shape, top_shape

    def reshape(self, bottom, top):
        if self.nd:
            return self._reshape_nd(bottom, top, lambda spatial: tuple(
                self.output_size(*a) for a in zip(spatial, *self.geometry)))
        kh, kw, sy, sx, ph, pw, dy, dx = self.geometry
        first = bottom[0].shape
        for b, t in zip(bottom, top):
            self._check_bottom(b)
            if b.shape != first:
                raise ShapeError(f"all bottoms need one shape, got {first} and {b.shape}", key="bottom")
            self._check_weight_channels(b.shape, b.shape[1])
            out_h = self.output_size(b.shape[2], kh, sy, ph, dy)
            out_w = self.output_size(b.shape[3], kw, sx, pw, dx)
            if out_h < 1 or out_w < 1:
                raise self._no_output(b.shape)
            t.reshape(b.shape[0], self.num_output, out_h, out_w)
        self.engines.choose(*self._engine_shapes(first, top[0].shape), self.blobs[0].shape, self.dtype, self.xp)

    def get_state(self):
        """AUTO's engine choices, which a snapshot keeps (:meth:`ConvEngines.get_state`)."""
        return self.engines.get_state()

    def set_state(self, state):
        self.engines.set_state(state)

    @property
    def engine_choice(self):
        """``{"forward": name, "backward": name}``; None for a direction AUTO has not settled yet."""
        return self.engines.choice

    @property
    def workspace_bytes(self):
        """Bytes of the engines' reused workspaces (after AUTO settles, only the chosen engines')."""
        return self.engines.workspace_bytes

    # set by Net.training_pass where backward follows this forward with the bottom unchanged: the engine may keep what
    # it derives from the bottom for backward (Winograd's input tiles)
    keep_for_backward = False

    @property
    def kept_bytes(self):
        """Bytes the engines hold for the backward of a training pass (Net.training_pass; net/memory.py's caches)."""
        return self.engines.kept_bytes

    def forward(self, bottom, top):
        b = self.blobs[1].data if self.bias_term else None
        f = self._flat
        for x, y in zip(bottom, top):
            self.engines.run("forward", f(x.data), self.blobs[0].data, b, f(y.data), keep=self.keep_for_backward)

    def backward(self, top, propagate_down, bottom):
        gb = self.blobs[1].diff if self.bias_term else None
        f = self._flat
        for i, (x, y) in enumerate(zip(bottom, top)):
            gx = f(x.diff) if propagate_down[i] else None
            self.engines.run("backward", f(x.data), self.blobs[0].data, f(y.diff), self.blobs[0].diff, gb, gx,
                             i in self.bottom_diffs_added)

    def multiply_adds(self, bottom, top):
        # per output value: one multiply-add per weight of one filter
        return sum(t.count * (self.blobs[0].count // self.blobs[0].shape[0]) for t in top)
