"""AUTO's choice of convolution engines: which engines a layer's ``engine`` lets it time (:data:`ENGINE_CHOICES`,
:func:`candidate_engines`), the timing of its first calls (:class:`AutoChoice`), the engines one layer holds and
runs (:class:`ConvEngines`: candidates, timing, the cache, the snapshot state), settling a net's choices on scratch
arrays before its first counted pass (:func:`settle_apart`: the solver's first iteration, a test's first batch), and
waiting until a net's choices have settled over passes (:func:`settle_engines`). The choices persist in snapshots
and in the on-disk cache beside this module (engine_cache.py); the engines themselves are implicit_gemm.py's and
winograd.py's.

The log says what AUTO does in two lines at the default level, one when the timing starts and one when every
convolution timing at that moment has chosen (:class:`_Summary`); each layer's choice and times, and each layer that
found its choice in the cache, are lines marked ``detail`` (logs.DETAIL), shown with ``--verbose`` (``GLOG_v=1``).
A timed call that a signal interrupts (Ctrl-C outside training's loop raises: errors.interrupting) records nothing, so no cut-short
timing is ever chosen from or cached.
"""
import collections
import contextlib
import logging
import time
import types
import weakref
from collections.abc import Mapping

import numpy

from .. import trace
from ..backend import Stopwatch
from ..logs import DETAIL
from . import blas, engine_cache, winograd
from .implicit_gemm import ENGINES
from .workspace import free_arenas

logger = logging.getLogger("layerforge")
ROUNDS = "1 untimed round, then 2 timed"  # AutoChoice's defaults


class AutoChoice:
    """Times each engine over the first calls of one direction and keeps the fastest (swCaffe's per-layer choice).

    Calls go round-robin over the engines: ``warmup`` rounds untimed (first-touch allocation of workspaces),
    then ``trials`` timed rounds; an engine whose best time so far is over ``prune`` times the fastest engine's
    leaves the later timed rounds (it could win only if a disturbance had doubled its time; on ResNet-50 this
    saves a fifth of AUTO's time, the slow engines' calls being the long ones). The engine with the smallest time
    wins (the minimum is the figure least disturbed by other work on the machine). Every call computes the full
    result with some engine, so the choice can only change results by float rounding. The schedule follows from
    ``calls`` and ``times`` alone, which is what a snapshot keeps.
    """

    def __init__(self, names, warmup=1, trials=2, prune=2.0):  # the defaults: ROUNDS
        self.names, self.warmup, self.trials, self.prune = tuple(names), warmup, trials, prune
        self.calls, self.choice = 0, (self.names[0] if len(self.names) == 1 else None)
        self.times = {name: [] for name in self.names}
        # an engine's timed calls less what each derived again that its own forward would have kept for it
        # (Winograd's backward: ConvEngines._backward_after_own_forward), where the engine tells
        self.kept_times = {}

    def _rounds(self):
        """The engines of each round, as far as the times so far decide them (a round not yet decided: the engines
        of the last decided one, so the calls it counts are at most the ones left)."""
        rounds, active = [self.names] * self.warmup, self.names
        for timed in range(self.trials):
            rounds.append(active)
            if any(len(self.times[name]) <= timed for name in active):  # this round is still running
                return rounds + [active] * (self.trials - timed - 1)
            best = {name: min(self.times[name][:timed + 1]) for name in active}
            fastest = min(best.values())
            active = tuple(name for name in active if best[name] <= self.prune * fastest)
        return rounds

    def next(self):
        if self.choice:
            return self.choice
        k = self.calls
        for names in self._rounds():
            if k < len(names):
                return names[k]
            k -= len(names)
        raise AssertionError("AUTO's timing ended without a choice")

    @property
    def calls_left(self):
        """Calls until the choice (0 once made); at most this many: an engine may leave the later rounds."""
        return 0 if self.choice else sum(map(len, self._rounds())) - self.calls

    def record_kept(self, name, seconds):
        """Note, before :meth:`record` notes the call, what it would have taken with what its engine's forward keeps
        for it (a timed call only, as the times)."""
        if self.choice is None and self.calls >= self.warmup * len(self.names):
            self.kept_times.setdefault(name, []).append(seconds)

    def kept_saving(self, name):
        """Seconds by which ``name``'s best timed call, less what its engine's forward would have kept for it
        (:meth:`record_kept`), beats the fastest engine's best timed call; 0.0 where it does not or nothing tells."""
        timed = [min(v) for v in self.times.values() if v]
        kept = self.kept_times.get(name)
        return max(0.0, min(timed) - min(kept)) if timed and kept else 0.0

    def record(self, name, seconds):
        """Note one call's time; returns True when this call settled the choice."""
        if self.choice is not None:
            return False
        if self.calls >= self.warmup * len(self.names):
            self.times[name].append(seconds)
        self.calls += 1
        if self.calls_left > 0:
            return False
        self.choice = min(self.names, key=lambda k: min(self.times[k]))  # every engine ran the first timed round
        return True


# engine name in the config -> the engines it may run; DEFAULT (Caffe's CAFFE/DEFAULT after import) means AUTO
# AUTO does not try IM2COL (or Winograd) where its column and output buffers (its tiles) would exceed this many bytes
AUTO_WORKSPACE_LIMIT = 64 << 20
# AUTO also tries WINOGRAD_F2 and WINOGRAD (F(4,3)) on eligible layers (3x3, stride 1, undilated, or strided ones
# spanning 3x3 strides, over space-to-depth blocks), and WINOGRAD_F2 (F(2,5)) on 5x5 ones. F(2,3)'s float32 error is
# that of direct convolution (within 2x, docs/performance.md); F(4,3)'s is 8-30x direct's, at most 1.4e-5 of the
# largest value of y, gx or gW on every 3x3 shape of the zoo nets with 64-512 input channels per group, and F(2,5)'s
# 4-25x, at most 1.2e-5 on the zoo's 5x5 shapes and others to 512 channels, which tests/kernels/test_winograd.py
# bounds per shape (3e-5): AUTO tries them only within those ranges of channels.
ENGINE_CHOICES = {"AUTO": ("IM2COL", "IMPLICIT", "WINOGRAD_F2", "WINOGRAD"),
                  "DEFAULT": ("IM2COL", "IMPLICIT", "WINOGRAD_F2", "WINOGRAD"),
                  "IM2COL": ("IM2COL",), "IMPLICIT": ("IMPLICIT",), "WINOGRAD": ("WINOGRAD",),
                  "WINOGRAD_F2": ("WINOGRAD_F2",)}
WINOGRAD_ENGINES = ("WINOGRAD", "WINOGRAD_F2")
WINOGRAD_TILES = {"WINOGRAD": 4, "WINOGRAD_F2": 2}  # output tile size m of F(m, r)
# Winograd's transforms cost per input channel and save per channel pair: below this many input channels per
# group, by filter size, F(m,3) lost to the GEMM engines by 2-12x on every layer measured (docs/performance.md), so
# AUTO does not spend its timing calls on it there; F(2,5) saves 25 - 9 multiplications a channel pair where F(2,3)
# saves 9 - 4, and won or tied down to GoogLeNet's 16 channels
AUTO_WINOGRAD_MIN_CHANNELS = {3: 64, 5: 16}
# a strided layer runs Winograd over space-to-depth blocks (kernels.space_to_depth), C sy sx / G channels of them,
# against GEMM engines whose strided lowering costs about as much as their products: F(4,3) won 2-3x on AlexNet's
# conv1 (48 block channels), tied at 16 and lost at 12 (docs/performance.md), so AUTO tries it from 16 block channels
AUTO_WINOGRAD_MIN_BLOCK_CHANNELS = 16
# the most input channels per group whose F(4,3) (and F(2,5)) float32 error the tests bound (ResNet-50's and
# VGG-16's 512)
AUTO_WINOGRAD_F4_MAX_CHANNELS = 512


def engines_settled(net, directions=None):
    """True once every AUTO convolution (or deconvolution) of ``net`` has chosen its engines (of ``directions``,
    default both)."""
    return all(getattr(layer, "engine_choice", {}).get(d, "") is not None
               for layer in net.layers for d in directions or DIRECTIONS)


def forward_settled(net, limit=20):
    """``net.forward()`` of a TEST net computed with AUTO's chosen forward engines alone; returns its outputs. The
    forward engines still undecided are settled first on scratch arrays (:func:`settle_apart`), so that a test's
    scores repeat whether this run timed the engines or a previous one did (timing calls round-robin over the
    engines, whose results differ in the last bits), and every layer runs once a batch, as ever."""
    settle_apart(net, ("forward",), limit)
    return net.forward()


def settle_apart(net, directions=None, limit=20):
    """Settle AUTO's choices of ``net`` (of ``directions``, default both) before its first counted pass: each AUTO
    convolution that has not chosen runs its layer's forward (and its backward, where the net runs it, with the
    net's ``propagate_down``) on scratch arrays of its bottoms' and tops' shapes until it has chosen (at most
    ``limit`` calls per direction). Nothing of the net is read or written but the layer's parameters (read) and
    engines: not its blobs, its parameters' diffs, its random streams, its data layers' cursors or hooks; so a
    seeded run computes every counted pass with the chosen engines, whether this run timed them or found them in
    the engine cache (or a snapshot). The timing says one summary line for all the layers (``--verbose``: each).
    Returns the seconds it took (0.0 when every choice was made already)."""
    directions, need_backward = directions or DIRECTIONS, net.layer_need_backward
    todo = []
    for i, layer in enumerate(net.layers):
        choice = getattr(layer, "engine_choice", None) or {}
        wanted = [d for d in directions if d in choice and choice[d] is None and (d == "forward" or need_backward[i])]
        if wanted:
            todo.append((i, layer, wanted))
    if not todo:
        return 0.0
    t0 = time.perf_counter()
    values = numpy.random.default_rng(0)  # the scratch values: a stream of its own, not the net's
    with SUMMARY.together():
        for i, layer, wanted in todo:
            _settle_layer(net, i, layer, wanted, limit, values)
    return time.perf_counter() - t0


def _scratch(blob, xp, values):
    """An array pair of ``blob``'s shape and dtype (``data`` and ``diff`` of values in [-0.5, 0.5)), apart from it."""
    def fill():
        return xp.asarray((values.random(blob.shape, dtype=numpy.float32) - 0.5).astype(blob.dtype))
    return types.SimpleNamespace(data=fill(), diff=fill())


def _settle_layer(net, i, layer, wanted, limit, values):
    xp = net.xp
    bottom = [_scratch(b, xp, values) for b in net.bottom_blobs(i)]
    top = [_scratch(t, xp, values) for t in net.top_blobs(i)]
    propagate_down = net.bottom_need_backward[i]
    with net.scratch_param_diffs(i):  # a trial's weight gradients go to arrays of their own
        for _ in range(limit):
            left = [d for d in wanted if layer.engine_choice[d] is None]
            if not left:
                break
            if "forward" in left:
                layer.forward(bottom, top)
            if "backward" in left:
                layer.backward(top, propagate_down, bottom)


def settle_engines(net, one_pass, limit=20):
    """Call ``one_pass(k)`` (k = 0, 1, ...: a forward-backward pass or a training iteration of ``net``) until every
    AUTO convolution of ``net`` has chosen its engines, at least once and at most ``limit`` times; returns how
    many passes ran. Timings taken before then would include AUTO's trials of every engine."""
    passes = 0
    while passes < 1 or (passes < limit and not engines_settled(net)):
        one_pass(passes)
        passes += 1
    return passes


def passes_to_settle(net):
    """Passes (forward-backward, or training iterations) still needed before every AUTO convolution of ``net`` has
    chosen: AUTO's round-robin takes one call per direction and pass."""
    left = [t.calls_left for layer in net.layers if isinstance(getattr(layer, "engines", None), ConvEngines)
            for t in layer.engines.tuning.values() if t.choice is None]
    return max(left, default=0)


class _Summary:
    """The default log level's account of AUTO's timing in this process: a line when the first timed call runs, and
    one when every direction that was being timed has chosen (counts of the engines chosen, the time it took)."""

    def __init__(self):
        self.timing = weakref.WeakValueDictionary()  # id -> ConvEngines with a direction timing now
        self.chosen = collections.Counter()  # (direction, engine) settled since the last summary
        self.cached = []  # layers that took their engines from the cache since the last line about it
        self.started = None
        self.held = 0  # within together(): the layers are timed one after another, the summary waits for the last

    def timed(self, engines):
        if self.started is None:
            self.started = time.perf_counter()
            logger.info("AUTO is timing the engines of the Convolution layers: each tries its candidates (%s) over its first "
                        "calls (%s), and keeps the fastest; one line when all have chosen (each layer's with "
                        "--verbose)", ", ".join(ENGINE_CHOICES["AUTO"]), ROUNDS)
        self.timing[id(engines)] = engines

    def settled(self, engines, direction, name):
        self.chosen[direction, name] += 1
        if not any(t.calls and t.choice is None for t in engines.tuning.values()):
            self.timing.pop(id(engines), None)
        if not self.held and not self._timing_now():
            self._report()

    def _timing_now(self):
        return any(t.calls and t.choice is None for e in self.timing.values() for t in e.tuning.values())

    @contextlib.contextmanager
    def together(self):
        """Within the block, one summary for every layer timed in it (:func:`settle_apart` times them one after
        another), said when the block ends; none when it ends by an exception (a Ctrl-C)."""
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1
        if not self.held and self.chosen and not self._timing_now():
            self._report()

    def _report(self):
        per = {d: ", ".join(f"{k} {n}" for (dd, k), n in self.chosen.most_common() if dd == d) for d in DIRECTIONS}
        where = engine_cache.cache_path()
        logger.info("AUTO chose engines for %d directions of Convolution layers in %.1f s (%s); %s",
                    sum(self.chosen.values()), time.perf_counter() - self.started,
                    "; ".join(f"{d} engine {per[d]}" for d in DIRECTIONS if per[d]),
                    f"remembered in {where}" if where else "the engine cache is off")
        self.chosen.clear()
        self.started = None

    def from_cache(self, layer_name):
        self.cached.append(layer_name)

    def flush_cached(self):
        if self.cached:
            logger.info("%d Convolution layer(s) found their engines in the engine cache %s (each with --verbose)",
                        len(self.cached), engine_cache.cache_path())
            self.cached = []


SUMMARY = _Summary()


def im2col_bytes(x_shape, y_shape, kernel, itemsize):
    """Bytes of IM2COL's full column buffer and output for a 2-D convolution from ``x_shape`` to ``y_shape`` with
    a ``kernel = (kh, kw)`` and elements of ``itemsize`` bytes."""
    kh, kw = kernel
    n, c = x_shape[:2]
    return itemsize * n * y_shape[2] * y_shape[3] * (c * kh * kw + y_shape[1])


def candidate_engines(engine, geometry, group, x_shape, y_shape, itemsize, compiled):
    """The engines a 2-D convolution with ``engine`` (a key of :data:`ENGINE_CHOICES`, DEFAULT read as AUTO), its
    ``geometry`` (kh, kw, sy, sx, ph, pw, dy, dx) and ``group`` runs or times from ``x_shape`` to ``y_shape``.

    AUTO leaves out the Winograd engines where they do not apply, where there are fewer than
    :data:`AUTO_WINOGRAD_MIN_CHANNELS` input channels per group (for the filter size; a strided layer counts the
    channels of its space-to-depth blocks against :data:`AUTO_WINOGRAD_MIN_BLOCK_CHANNELS`), or where one image's tiles
    would exceed :data:`AUTO_WORKSPACE_LIMIT` (``compiled``: the CPU's compiled transforms; a larger batch runs in
    chunks of images, winograd.CHUNK_BYTES, so this does not depend on the batch); WINOGRAD (F(4,3)) and F(2,5) also
    above :data:`AUTO_WINOGRAD_F4_MAX_CHANNELS` (beyond their tested error bound); and IM2COL where its column buffer
    would (like cuDNN's workspace limit: a huge column buffer is never allocated just to try it). Under
    :func:`blas.batch_invariant <layerforge.kernels.blas.batch_invariant>` AUTO times only engines that give an
    image the same bits in any batch: on the CPU all of them (every float32 product computes each element as one
    blocked FMA chain, by OpenBLAS's large path or by kernels/thin_gemm.py: IM2COL and IMPLICIT the same sums, each
    Winograd engine its own sums, the same for an image in any batch; which of these arithmetics a layer's forward
    computes is then chosen once per per-image problem, :class:`ConvEngines`); on a GPU those that declare
    ``batch_invariant`` (on a GPU
    IMPLICIT's tiled kernel, whose chains over K do not depend on the batch: IM2COL's GEMM is cuBLAS's, which chooses
    its kernels by the shapes, and its results differ from IMPLICIT's in the last bits; Winograd's tile transforms
    are products over the whole batch).
    """
    names = ENGINE_CHOICES[engine]
    channels = x_shape[1] // group * geometry[2] * geometry[3]  # per group, of the space-to-depth blocks if strided
    least = AUTO_WINOGRAD_MIN_BLOCK_CHANNELS if tuple(geometry[2:4]) != (1, 1) else \
        AUTO_WINOGRAD_MIN_CHANNELS.get(winograd.block_kernel(geometry)[0])
    image = (1,) + tuple(x_shape[1:])
    if len(names) > 1:
        names = tuple(k for k in names if k not in WINOGRAD_ENGINES or (
            winograd.eligible(geometry, WINOGRAD_TILES[k]) and least <= channels
            and ((WINOGRAD_TILES[k], winograd.block_kernel(geometry)[0]) == (2, 3)
                 or channels <= AUTO_WINOGRAD_F4_MAX_CHANNELS)
            and winograd.workspace_estimate(image, y_shape[1], geometry, WINOGRAD_TILES[k], itemsize,
                                            compiled=compiled) <= AUTO_WORKSPACE_LIMIT))
    if len(names) > 1 and im2col_bytes(x_shape, y_shape, geometry[:2], itemsize) > AUTO_WORKSPACE_LIMIT:
        names = tuple(k for k in names if k != "IM2COL")
    if len(names) > 1 and blas.batch_invariant() and not compiled:
        names = tuple(k for k in names if ENGINES[k].batch_invariant)
    return names


def arithmetic(engine_name):
    """The sums an engine computes, which fix its results' bits under :func:`blas.batch_invariant
    <layerforge.kernels.blas.batch_invariant>`: ``GEMM`` for IM2COL and IMPLICIT (the same sums, bit for bit), a
    Winograd engine's own name for its tiles' sums."""
    return engine_name if engine_name in WINOGRAD_ENGINES else "GEMM"


# under blas.batch_invariant: (machine key, per-image layer key) -> the arithmetic (:func:`arithmetic`) that every
# forward of that per-image convolution computes in this process, whatever its batch (ConvEngines)
_SHARED_FORWARD = {}


DIRECTIONS = ("forward", "backward")


class ConvEngines(Mapping):
    """The engines of one convolution layer (engine name -> engine, :data:`implicit_gemm.ENGINES`) and AUTO's
    choice among them, separately for forward and backward.

    The layer calls :meth:`choose` from ``reshape`` (again only when the input shape changes) and :meth:`run` from
    ``forward`` / ``backward``. Until a direction has settled, :meth:`run` goes round-robin over the candidates
    (:class:`AutoChoice`), timing each call with a :class:`~layerforge.backend.Stopwatch` (CUDA events on a GPU),
    and each direction keeps its fastest, except where a forward keeps its tiles for its own backward (Winograd's,
    on the host): there the two choose together (:meth:`_forward_for_its_backward`,
    :meth:`_backward_after_own_forward`); a settled choice is logged, frees the other engines' workspaces and is
    stored in the engine cache (engine_cache.py), each direction once it has chosen (a TEST net's forward is
    remembered alone), which :meth:`choose` reads first. :meth:`get_state` / :meth:`set_state` are what a snapshot
    keeps of it.
    """

    def __init__(self, layer_type, layer_name, engine, geometry, group):
        self.layer_type, self.layer_name = layer_type, layer_name
        self.engine, self.geometry, self.group = engine, geometry, group  # engine: a key of ENGINE_CHOICES
        self.shape, self.cache_key = None, None  # the input shape the engines were chosen for; its cache key
        self.image_key = None  # under batch invariance: the per-image convolution's key (_follow_shared_forward)
        self._by_name, self.tuning = {}, {}

    def __getitem__(self, name):
        return self._by_name[name]

    def __iter__(self):
        return iter(self._by_name)

    def __len__(self):
        return len(self._by_name)

    def use(self, name, engine):
        """Run ``engine`` alone in both directions (the N-d path: nothing to choose); kept once given."""
        if not self._by_name:
            self._by_name = {name: engine}
            self.tuning = {d: AutoChoice((name,)) for d in DIRECTIONS}

    def choose(self, x_shape, y_shape, w_shape, dtype, xp):
        """Set up the engines for a convolution from ``x_shape`` to ``y_shape`` with weights of ``w_shape`` (again
        when the shape changes: a new shape may favour another engine), taking settled choices from the cache."""
        if x_shape == self.shape:
            return
        self.shape = x_shape
        names = candidate_engines(self.engine, self.geometry, self.group, x_shape, y_shape, dtype.itemsize,
                                  compiled=xp is numpy)
        self._by_name = {name: ENGINES[name](self.geometry, self.group) for name in names}
        self.tuning = {d: AutoChoice(names) for d in DIRECTIONS}
        self._stopwatch = Stopwatch(xp)  # device time on a GPU (CUDA events), the host clock on numpy
        self.cache_key = self.image_key = None
        if len(names) > 1:
            machine = engine_cache.machine_key(xp)
            self.cache_key = (machine, engine_cache.layer_key(
                self.layer_type, x_shape, y_shape, w_shape, self.geometry, self.group, dtype, names))
            sums = sorted({arithmetic(k) for k in names})
            if blas.batch_invariant() and len(sums) > 1:
                self.image_key = (machine, engine_cache.layer_key(
                    self.layer_type, ("N",) + tuple(x_shape[1:]), ("N",) + tuple(y_shape[1:]), w_shape,
                    self.geometry, self.group, dtype, ["one image"] + sums))
                self._follow_shared_forward(engine_cache.lookup(*self.image_key))
            cached = engine_cache.lookup(*self.cache_key)
            # a direction alone (a TEST net's forward, which never runs backward) is remembered too
            if cached and set(cached) <= set(self.tuning) and all(
                    k in self.tuning[d].names for d, k in cached.items()):
                self.set_state({"shape": list(x_shape), "choice": cached})
                logger.info("%s '%s': %s (from the engine cache %s)", self.layer_type, self.layer_name,
                            ", ".join(f"{d} engine {cached[d]}" for d in DIRECTIONS if d in cached),
                            engine_cache.cache_path(), extra=DETAIL)
                SUMMARY.from_cache(self.layer_name)

    @property
    def choice(self):
        """``{"forward": name, "backward": name}``; None for a direction AUTO has not settled yet."""
        return {d: t.choice for d, t in self.tuning.items()}

    @property
    def workspace_bytes(self):
        """Bytes of the engines' reused workspaces (after AUTO settles, only the chosen engines')."""
        return sum(e.workspace_bytes for e in self._by_name.values())

    def run(self, direction, *args, method=None, keep=False):
        """Run engine ``method`` (default: ``direction``), timing it for AUTO's choice in ``direction``. ``keep``
        (a forward whose backward follows with the same input: Net.training_pass): where both directions have
        settled on one engine that can (``keeps_input_tiles``: Winograd's), it keeps what it derived from the input
        for its backward."""
        if self.image_key and direction == "forward" and not self.tuning[direction].choice:
            self._follow_shared_forward()
        tune = self.tuning[direction]
        if SUMMARY.cached:
            SUMMARY.flush_cached()
        if tune.choice:
            engine = self._by_name[tune.choice]
            if keep and method is None and self.tuning["backward"].choice == tune.choice and \
                    getattr(engine, "keeps_input_tiles", False):
                return engine.forward(*args, keep=True)
            return getattr(engine, method or direction)(*args)
        SUMMARY.timed(self)
        name = tune.next()
        engine = self._by_name[name]
        with trace.span(direction, self.layer_name, trial=name):  # AUTO's trial of one engine, in the layer's span
            self._stopwatch.start()
            getattr(engine, method or direction)(*args)
            seconds = self._stopwatch.stop()
        rederived = getattr(engine, "rederived_seconds", None) if direction == "backward" and method is None else None
        if rederived is not None:
            tune.record_kept(name, seconds - rederived)
        if tune.record(name, seconds):
            if direction == "forward":
                self._forward_for_its_backward()
            times = ", ".join(f"{k} {1000 * min(v):.3f} ms" for k, v in tune.times.items())
            logger.info("%s '%s': %s engine %s (%s)", self.layer_type, self.layer_name, direction, tune.choice, times,
                        extra=DETAIL)
            self._backward_after_own_forward()
            self._release_unchosen()
            if direction == "forward":
                self._share_forward(tune.choice)
            if self.cache_key:  # each direction once it has chosen
                engine_cache.store(*self.cache_key, {d: k for d, k in self.choice.items() if k is not None})
            SUMMARY.settled(self, direction, tune.choice)

    @property
    def kept_bytes(self):
        """Bytes of what the engines keep from forward for backward (:meth:`run`'s ``keep``), reused pass after pass."""
        return sum(getattr(e, "kept_bytes", 0) for e in self._by_name.values())

    def drop_kept(self):
        """Forget what an engine's forward kept for a backward (:meth:`run`'s ``keep``)."""
        for engine in self._by_name.values():
            if getattr(engine, "kept", None) is not None:
                engine.kept = None

    def get_state(self):
        """AUTO's engine choices and the input shape they were made for (a snapshot keeps them, so a resumed run
        computes with the same engines, bit for bit, instead of timing them again); a direction still being
        timed keeps its call count and times, so the resumed run goes on with the same round-robin."""
        if not self.tuning or self.shape is None:
            return None
        return {"shape": list(self.shape), "choice": self.choice,
                "timing": {d: {"calls": t.calls, "times": t.times, "kept_times": t.kept_times}
                           for d, t in self.tuning.items() if not t.choice}}

    def set_state(self, state):
        """Take the engine choices of :meth:`get_state` when they were made for the current shape."""
        if not state or not self.tuning or list(self.shape or ()) != state["shape"]:
            return
        for direction, name in state["choice"].items():
            if name in self._by_name and direction in self.tuning:
                self.tuning[direction].choice = name
                if direction == "forward":
                    self._share_forward(name)
        for direction, progress in state.get("timing", {}).items():
            tune = self.tuning.get(direction)
            if tune is not None and set(progress["times"]) == set(tune.times):
                # the saved run was still timing: go on with its round-robin, even where the cache knows better
                tune.choice, tune.calls = None, int(progress["calls"])
                tune.times = {k: list(v) for k, v in progress["times"].items()}
                tune.kept_times = {k: list(v) for k, v in progress.get("kept_times", {}).items()}
        self._release_unchosen()

    def _follow_shared_forward(self, cached=None):
        """Under :func:`blas.batch_invariant <layerforge.kernels.blas.batch_invariant>`: let the forward time only
        the engines of the arithmetic (:func:`arithmetic`) that this per-image convolution's forward computes
        already in this process, at any batch, or (``cached``: the engine cache's entry for it) computed in an
        earlier run on this machine, so that an image's output never depends on the batch it comes in."""
        sums = _SHARED_FORWARD.get(self.image_key)
        if sums is None and cached and cached.get("forward") in ("GEMM",) + WINOGRAD_ENGINES:
            sums = _SHARED_FORWARD[self.image_key] = cached["forward"]
        tune = self.tuning["forward"]
        names = tuple(k for k in tune.names if arithmetic(k) == sums)
        if names and names != tune.names:
            self.tuning["forward"] = AutoChoice(names)

    def _share_forward(self, name):
        """The forward computes ``name``'s arithmetic: the first choice for its per-image convolution holds for
        every batch of this process and is stored in the engine cache for later runs."""
        if self.image_key and self.image_key not in _SHARED_FORWARD:
            _SHARED_FORWARD[self.image_key] = arithmetic(name)
            engine_cache.store(*self.image_key, {"forward": arithmetic(name)})

    def _forward_for_its_backward(self):
        """Forward, having settled from its timed calls, takes the engine whose forward time less what its backward
        saves on the fastest backward, handed what this forward keeps (Winograd's tiles and transformed filters),
        is least, where backward's timed calls so far tell (in training a call behind forward's; none in a net that
        never runs backward). ResNet-50's 14 x 14 layers: F(2,3)'s forward a little faster than F(4,3)'s, but F(4,3)'s
        backward, handed its tiles, faster than F(2,3)'s by more (docs/performance.md)."""
        forward, backward = self.tuning["forward"], self.tuning["backward"]
        if not backward.kept_times:
            return

        def cost(name):
            return min(forward.times[name]) - (backward.kept_saving(name) if self._keeps_tiles(name) else 0.0)
        best = min((k for k in forward.names if forward.times[k]), key=cost)
        if best != forward.choice:
            logger.info("%s '%s': forward engine %s rather than %s, for the tiles it keeps for its backward (%.3f ms "
                        "less what its backward then saves, against %.3f ms)", self.layer_type, self.layer_name, best,
                        forward.choice, 1000 * cost(best), 1000 * cost(forward.choice), extra=DETAIL)
            forward.choice = best

    def _backward_after_own_forward(self):
        """Once both directions have settled from their timed calls: where forward's engine keeps what it derives
        from the input for its own backward (``keeps_input_tiles``: Winograd's tiles and transformed filters) and
        backward settled on another, backward takes forward's engine if its timed calls, less what each derived
        again (what a kept forward hands it), were faster. Each direction is timed alone, where no backward has a
        forward's tiles: ResNet-50's 14 x 14 layers chose F(2,3) forward and F(4,3) backward, which then transformed
        the input and the filters again every pass (docs/performance.md)."""
        forward, backward = self.tuning["forward"].choice, self.tuning["backward"]
        if not forward or not backward.choice or forward == backward.choice or not self._keeps_tiles(forward):
            return
        saving = backward.kept_saving(forward)
        if saving > 0.0:
            logger.info("%s '%s': backward engine %s, forward's (%.3f ms less than %s's with the tiles its forward "
                        "keeps)", self.layer_type, self.layer_name, forward, 1000 * saving, backward.choice,
                        extra=DETAIL)
            backward.choice = forward

    def _keeps_tiles(self, name):
        # whether engine ``name``'s forward keeps what it derives from the input for its own backward (Winograd's)
        return getattr(self._by_name.get(name), "keeps_input_tiles", False)

    def _release_unchosen(self):
        """Once both directions are settled, free the other engines' workspaces."""
        chosen = {t.choice for t in self.tuning.values()}
        if None in chosen:
            return
        for k, engine in self._by_name.items():
            if k not in chosen:
                engine.release()
        free_arenas()  # shrink to what the chosen engines ask for from the next call on
