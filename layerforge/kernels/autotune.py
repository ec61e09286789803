"""AUTO's choice of convolution engines: which engines a layer's ``engine`` lets it time (:data:`ENGINE_CHOICES`,
:func:`candidate_engines`), the timing of its first calls (:class:`AutoChoice`), and waiting until a net's choices
have settled (:func:`settle_engines`). The choices persist in snapshots and in the on-disk cache beside this module
(engine_cache.py); the engines themselves are implicit_gemm.py's and winograd.py's.
"""
from . import blas, winograd
from .implicit_gemm import ENGINES


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
# AUTO does not try IM2COL (or Winograd) where its column and output buffers (its tiles) would exceed this many bytes
AUTO_WORKSPACE_LIMIT = 64 << 20
# AUTO also tries WINOGRAD_F2 on eligible layers (3x3, stride 1, undilated): its float32 error is that of direct
# convolution (within 2x, docs/performance.md). F(4,3)'s is 10-25x larger, so WINOGRAD runs only when named.
ENGINE_CHOICES = {"AUTO": ("IM2COL", "IMPLICIT", "WINOGRAD_F2"), "DEFAULT": ("IM2COL", "IMPLICIT", "WINOGRAD_F2"),
                  "IM2COL": ("IM2COL",), "IMPLICIT": ("IMPLICIT",), "WINOGRAD": ("WINOGRAD",),
                  "WINOGRAD_F2": ("WINOGRAD_F2",)}
WINOGRAD_ENGINES = ("WINOGRAD", "WINOGRAD_F2")
# Winograd's transforms cost per input channel and save per channel pair: below this many input channels per
# group it lost to the GEMM engines by 2-12x on every layer measured (docs/performance.md), so AUTO does not
# spend its timing calls on it there
AUTO_WINOGRAD_MIN_CHANNELS = 64


def engines_settled(net):
    """True once every AUTO convolution (or deconvolution) of ``net`` has chosen its engines."""
    return all(None not in getattr(layer, "engine_choice", {}).values() for layer in net.layers)


def settle_engines(net, one_pass, limit=20):
    """Call ``one_pass(k)`` (k = 0, 1, ...: a forward-backward pass or a training iteration of ``net``) until every
    AUTO convolution of ``net`` has chosen its engines, at least once and at most ``limit`` times; returns how
    many passes ran. Timings taken before then would include AUTO's trials of every engine."""
    passes = 0
    while passes < 1 or (passes < limit and not engines_settled(net)):
        one_pass(passes)
        passes += 1
    return passes


def im2col_bytes(x_shape, y_shape, kernel, itemsize):
    """Bytes of IM2COL's full column buffer and output for a 2-D convolution from ``x_shape`` to ``y_shape`` with
    a ``kernel = (kh, kw)`` and elements of ``itemsize`` bytes."""
    kh, kw = kernel
    n, c = x_shape[:2]
    return itemsize * n * y_shape[2] * y_shape[3] * (c * kh * kw + y_shape[1])


def candidate_engines(engine, geometry, group, x_shape, y_shape, itemsize, compiled):
    """The engines a 2-D convolution with ``engine`` (a key of :data:`ENGINE_CHOICES`, DEFAULT read as AUTO), its
    ``geometry`` (kh, kw, sy, sx, ph, pw, dy, dx) and ``group`` runs or times from ``x_shape`` to ``y_shape``.

    AUTO leaves out WINOGRAD_F2 where it does not apply, where there are fewer than
    :data:`AUTO_WINOGRAD_MIN_CHANNELS` input channels per group, or where its tiles would exceed
    :data:`AUTO_WORKSPACE_LIMIT` (``compiled``: the CPU's compiled transforms); and IM2COL where its column buffer
    would (like cuDNN's workspace limit: a huge column buffer is never allocated just to try it). Under
    :func:`blas.batch_invariant <layerforge.kernels.blas.batch_invariant>` AUTO times only the engines whose
    results do not depend on the batch (``batch_invariant`` of the engine classes, implicit_gemm.ENGINES).
    """
    names = ENGINE_CHOICES[engine]
    if len(names) > 1 and not (winograd.eligible(geometry)
                               and x_shape[1] // group >= AUTO_WINOGRAD_MIN_CHANNELS
                               and winograd.workspace_estimate(x_shape, y_shape[1], geometry, 2, itemsize,
                                                               compiled=compiled) <= AUTO_WORKSPACE_LIMIT):
        names = tuple(k for k in names if k not in WINOGRAD_ENGINES)
    if len(names) > 1 and im2col_bytes(x_shape, y_shape, geometry[:2], itemsize) > AUTO_WORKSPACE_LIMIT:
        names = tuple(k for k in names if k != "IM2COL")
    if len(names) > 1 and blas.batch_invariant():
        names = tuple(k for k in names if ENGINES[k].batch_invariant)
    return names
