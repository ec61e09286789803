"""Convolution (Caffe's ConvolutionLayer): 2-D, grouped, dilated; explicit im2col or implicit GEMM, autotuned."""
import logging
import time

from ..errors import ShapeError
from ..kernels.im2col import conv_output_size
from ..kernels.implicit_gemm import ENGINES, free_arenas
from ..schema import REQUIRED
from .base import FILLER, Field, Layer, register_layer

logger = logging.getLogger("layerforge")


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


class AutoChoice:
    """Times each engine over the first calls of one direction and keeps the fastest (swCaffe's per-layer choice).

    Calls go round-robin over the engines: ``warmup`` rounds untimed (first-touch allocation of workspaces),
    then ``trials`` timed rounds; the engine with the smallest time wins (the minimum is the figure least
    disturbed by other work on the machine). Every call computes the full result with some engine, so the
    choice can only change results by float rounding.
    """

    def __init__(self, names, warmup=1, trials=2):
        self.names, self.warmup, self.trials = tuple(names), warmup, trials
        self.calls, self.choice = 0, (self.names[0] if len(self.names) == 1 else None)
        self.times = {name: [] for name in self.names}

    def next(self):
        return self.choice or self.names[self.calls % len(self.names)]

    def record(self, name, seconds):
        """Note one call's time; returns True when this call settled the choice."""
        if self.choice is not None:
            return False
        if self.calls >= self.warmup * len(self.names):
            self.times[name].append(seconds)
        self.calls += 1
        if self.calls < (self.warmup + self.trials) * len(self.names):
            return False
        self.choice = min(self.names, key=lambda k: min(self.times[k]))
        return True


# engine name in the config -> the engines it may run; DEFAULT (Caffe's CAFFE/DEFAULT after import) means AUTO
# AUTO does not try IM2COL where its column and output buffers would exceed this many bytes
AUTO_WORKSPACE_LIMIT = 64 << 20
ENGINE_CHOICES = {"AUTO": ("IM2COL", "IMPLICIT"), "DEFAULT": ("IM2COL", "IMPLICIT"),
                  "IM2COL": ("IM2COL",), "IMPLICIT": ("IMPLICIT",)}


@register_layer("Convolution")
class Convolution(Layer):
    """2-D convolution (cross-correlation, as Caffe) of each bottom with shared filters.

    ``y[n, o, i, j] = b[o] + sum_{c, p, q} W[o, c, p, q] x[n, g(o) Cin/G + c, i sy - ph + p dy, j sx - pw + q dx]``
    with zero padding, where group ``g(o) = o // (Cout / G)`` sees only its Cin / G input channels.

    Shapes: bottom (N, Cin, H, W) -> top (N, Cout, Hout, Wout), ``Hout = (H + 2 ph - (dy (kh - 1) + 1)) // sy + 1``.
    Parameters: W (Cout, Cin / G, kh, kw), b (Cout,) when ``bias_term``. Several bottoms (each with its own
    top) share the parameters. Engines (``layerforge.kernels.implicit_gemm``): IM2COL runs one GEMM per
    group for the whole minibatch over a full column buffer; IMPLICIT lowers bounded tiles; AUTO times
    both over the first calls, separately for forward and backward, and keeps the faster
    (``engine_choice``; logged on the "layerforge" logger), except that it does not try IM2COL where
    the full column buffer would exceed ``AUTO_WORKSPACE_LIMIT``.
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
        "engine": Field("enum", "AUTO", choices=tuple(ENGINE_CHOICES),
                        doc="IM2COL (full column buffer), IMPLICIT (bounded tiles) or AUTO/DEFAULT (time both, "
                            "keep the faster per direction)"),
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
        self.engine = "AUTO" if p.engine == "DEFAULT" else p.engine
        self.engines = {}
        self._tuned_shape = None
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
        self._choose_engines(first, top[0].shape)

    def _choose_engines(self, x_shape, y_shape):
        """Set up the engines for a convolution from ``x_shape`` to ``y_shape`` (again when the shape changes)."""
        if x_shape == self._tuned_shape:
            return
        self._tuned_shape = x_shape  # a new shape may favour the other engine: choose again
        names = ENGINE_CHOICES[self.engine]
        if len(names) > 1 and self._im2col_bytes(x_shape, y_shape) > AUTO_WORKSPACE_LIMIT:
            names = ("IMPLICIT",)  # like cuDNN's workspace limit: never allocate a huge column buffer to try it
        self.engines = {name: ENGINES[name](self.geometry, self.group) for name in names}
        self.tuning = {d: AutoChoice(names) for d in ("forward", "backward")}

    def _im2col_bytes(self, x_shape, y_shape):
        kh, kw = self.geometry[:2]
        n, c = x_shape[:2]
        return self.dtype.itemsize * n * y_shape[2] * y_shape[3] * (c * kh * kw + y_shape[1])

    @property
    def engine_choice(self):
        """``{"forward": name, "backward": name}``; None for a direction AUTO has not settled yet."""
        return {d: t.choice for d, t in self.tuning.items()}

    @property
    def workspace_bytes(self):
        """Bytes of the engines' reused workspaces (after AUTO settles, only the chosen engines')."""
        return sum(e.workspace_bytes for e in self.engines.values())

    def _run(self, direction, *args, method=None):
        """Run engine ``method`` (default: ``direction``), timing it for AUTO's choice in ``direction``."""
        tune = self.tuning[direction]
        name = tune.next()
        t0 = time.perf_counter()
        getattr(self.engines[name], method or direction)(*args)
        if tune.record(name, time.perf_counter() - t0):
            times = ", ".join(f"{k} {1000 * min(v):.3f} ms" for k, v in tune.times.items())
            logger.info("%s '%s': %s engine %s (%s)", self.type, self.name, direction, tune.choice, times)
            chosen = {t.choice for t in self.tuning.values()}
            if None not in chosen:
                for k, engine in self.engines.items():
                    if k not in chosen:
                        engine.release()
                free_arenas()  # shrink to what the chosen engines ask for from the next call on

    def forward(self, bottom, top):
        b = self.blobs[1].data if self.bias_term else None
        for x, y in zip(bottom, top):
            self._run("forward", x.data, self.blobs[0].data, b, y.data)

    def backward(self, top, propagate_down, bottom):
        gb = self.blobs[1].diff if self.bias_term else None
        for i, (x, y) in enumerate(zip(bottom, top)):
            gx = x.diff if propagate_down[i] else None
            self._run("backward", x.data, self.blobs[0].data, y.diff, self.blobs[0].diff, gb, gx)

    def multiply_adds(self, bottom, top):
        kh, kw = self.geometry[:2]
        cin_g = self.blobs[0].shape[1]
        return sum(t.shape[0] * self.num_output * t.shape[2] * t.shape[3] * cin_g * kh * kw for t in top)
