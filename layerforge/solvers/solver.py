"""The solver loop (Caffe's Solver + SGDSolver): one fixed sequence per iteration; rules override compute_update.

One iteration (:meth:`Solver.step`), in this order; ``seam.x`` are the points where data parallelism acts
(:class:`~layerforge.solvers.seam.Seam`, given with :meth:`Solver.add_seam`; one process alone: they do nothing)::

    seam.start(iter) -> iter                              once, before the first iteration (after any restore);
        then AUTO's convolutions that have not chosen their engines time them apart (autotune.settle_apart)
    clear parameter diffs
    test, when iter % test_interval == 0 (and iter > 0 or test_initialization), on the root (every replica when
        seam.shares_tests); per test pass: seam.agree(signal request); after the passes: seam.reduce_test
        (eval_type DETECTION: first seam.gather_test_rows per output, the mAP is of the gathered rows; the
        scores are evaluation.py's)
    iter_size x (seam.before_pass(k) -> feed inputs -> forward -> backward, with seam.layer_gradients_ready(i)
        after each layer's backward when seam.layer_hooks)                diffs accumulate
    loss = seam.reduce_loss(mean loss of the passes); smoothed; displayed (the root, with seam.describe lines)
    seam.before_update() -> update?                       e.g. the allreduce of the summed diffs
    when update: (only the parameters of seam.update_share(), all when None)
        rate = learning_rate(iter)
        clip: scale all diffs by c / ||g|| when the global L2 norm ||g|| > clip_gradients = c
        normalise: diff /= iter_size
        per parameter, a block at a time on the host: seam.combine_gradient(i, block), regularise (diff += wd *
            decay_mult * w, or * sign(w) for L1), compute_update (the rule), apply: data -= diff
    seam.after_update()
    iter += 1; seam.end_iteration(iteration, loss); callbacks(iteration, loss)
    request = seam.agree(signal request)
    snapshot when iter % snapshot == 0 or the request says so: seam.before_snapshot(), the root writes,
        seam.after_snapshot()
    stop when the request says so

Caffe clips the sum of the iter_size passes, before it normalises (SGDSolver::ApplyUpdate), and so does this
loop; ``clip_after_normalize: true`` swaps the two, so that the clip threshold means the same for every
iter_size and ``iter_size: k`` with batch b stays equivalent to batch k*b even with clipping.

``sparse_update: lazy`` runs clip, normalise, regularise, compute_update and apply on only the rows of a
parameter whose gradient came as rows (Embed), see :meth:`Solver.update_rows`.
"""
import collections
import functools
import logging
import math
import os
import time

import numpy

from .. import backend, rng, trace
from ..errors import LayerforgeError
from ..net.net import Net
from ..kernels import blas
from ..kernels.autotune import engines_settled, forward_settled, settle_apart
from ..kernels.average_precision import AP_VERSIONS
from ..layers.data import input_display
from . import cuda_graph
from ..kernels.threadpool import num_threads, parallel_for
from ..registry import registrar
from . import snapshot as snapshots, snapshot_lock
from .evaluation import caffe_float as _g, evaluate, log_outputs, output_weights
from .param import learning_rate, load_solver_param
from .seam import Seams
from .signals import signal_handlers
from .train_net import refuse_untrainable

log = logging.getLogger("layerforge")

SOLVER_REGISTRY = {}


register_solver = registrar(SOLVER_REGISTRY, "solver type")
register_solver.__doc__ = "Class decorator: make a Solver subclass available as solver ``type: <type_name>``."


def get_solver(source, shard=None, split=None, **overrides):
    """Build the solver a YAML file (or dict) describes; ``overrides`` replace keys of the file (``max_iter=10``).

    ``shard=(rank, world_size)`` makes every data layer read only its shard (data-parallel training);
    ``split=(index, count)`` makes the train net replica ``index`` of ``count`` that compute one batch together
    (``Net(split=...)``; its test nets keep the whole batch and the whole test set).

    Returns:
        An instance of the class registered for the solver's ``type`` (SGD when absent).
    """
    sp = load_solver_param(source, SOLVER_REGISTRY, **overrides)
    return SOLVER_REGISTRY[sp.type](sp, shard=shard, split=split)


class NonFiniteError(LayerforgeError):
    """The loss (or a parameter) became NaN or infinite; training stopped without a snapshot of the bad state."""


class ParamArrays:
    """What an update rule is handed of one learnable parameter: its ``data`` and ``diff``, the whole parameter's
    arrays or views of one block of its elements, or the gathered rows that have a gradient (``sparse_update:
    lazy``); ``diff`` holds the regularised gradient on entry and the step to subtract on return."""

    __slots__ = ("data", "diff")

    def __init__(self, data, diff):
        self.data, self.diff = data, diff


class Solver:
    """Trains ``net`` with the loop above; a subclass supplies only :meth:`compute_update`.

    Args:
        param: a solver YAML path, a dict, or a SolverParameter. ``overrides`` replace keys.

    Attributes:
        net: the TRAIN net. test_nets: TEST nets, sharing the train net's parameter arrays.
        iter: number of updates done. state: the rule's state per learnable parameter (``state[i]``: its
            ``history_per_param`` arrays); :attr:`history` lists them in Caffe's layout.
        feed: optional ``feed(iteration, pass_index) -> {input name: array}`` called before every train
            forward pass, for nets whose data come from Input layers (pycaffe users write ``net.blobs``).
        callbacks: ``fn(iteration, loss)`` run after each update (``iteration`` is the index of the
            iteration that just finished, ``loss`` its mean loss over the iter_size passes).
        seam: the data-parallel seams given with :meth:`add_seam` (a :class:`~layerforge.solvers.seam.Seams`).
        root: whether this replica displays, logs test scores and writes snapshots (the seam's say).
        test_scores: the mean outputs of the last test of each test net.
    """

    type = None
    history_per_param = 1

    def __init__(self, param, shard=None, split=None, **overrides):
        sp = load_solver_param(param, SOLVER_REGISTRY, **overrides)  # a SolverParameter is not read again
        validate = getattr(type(self), "validate_params", None)
        if validate is not None:
            validate(sp)
        self.param = sp
        self.xp = self._array_module(sp)
        self.graphs, self._stream = None, None  # cuda_graph: IterationGraphs, and the stream iterations run on
        if sp.ap_version not in AP_VERSIONS:
            raise sp.error(f"unknown ap_version {sp.ap_version!r}; one of {', '.join(AP_VERSIONS)}", "ap_version")
        if sp.gemm_precision:
            blas.set_gemm_precision(sp.gemm_precision.lower())
        if sp.random_seed >= 0:
            rng.seed(sp.random_seed)
        dtype = sp.dtype.lower()

        self.net = Net(sp.train_net_source(), phase="train", dtype=dtype, xp=self.xp, shard=shard, split=split,
                       **_net_state(sp.train_state))
        test_shard = None if split is not None else shard  # replicas of one batch: tests as one process would
        sources = [sp.inline_net(d) for d in sp.test_net_param] + [sp.resolve(p) for p in sp.test_net]
        sources += [sp.resolve(sp.net) or sp.inline_net(sp.net_param)] * (sp.num_test_nets - len(sources))
        self.test_nets = []
        for k, src in enumerate(sources):
            st = sp.test_state[k] if sp.test_state else None
            tn = Net(src, phase="test", dtype=dtype, xp=self.xp, shard=test_shard, **_net_state(st))
            tn.share_params_with(self.net)  # same layer name -> same data arrays: updates need no copying
            self.test_nets.append(tn)
        # the rule's state, owned per parameter: history_per_param arrays of the parameter's shape each
        self.state = [[self.xp.zeros_like(p.data) for _ in range(self.history_per_param)]
                      for p in self.net.learnable_params]
        self.iter = 0
        self.losses = collections.deque(maxlen=sp.average_loss)
        self.smoothed_loss = 0.0
        self.feed, self.callbacks = None, []
        self.seam, self._started = Seams(), False
        self._input_line = input_display(self.net)  # input rate and waits of the image data layers, or None
        self.test_hooks = []  # fn(iteration, test net index, {output: mean value}) after each test pass
        self.requested_early_exit = False
        self._lazy = {}  # sparse_update lazy: {parameter index: its SparseGradient} during apply_update
        self.last_snapshot = None
        self.test_scores = [None] * len(self.test_nets)
        self._pending = []  # (signal number, effect) requested by signal handlers
        self.snapshot_prefix = snapshots.snapshot_prefix(sp)
        for w in sp.weights:
            self.load_weights(w)
        if sp.cuda_graph:
            reason = cuda_graph.refusal(self.net, sp.iter_size)
            if reason:
                raise sp.error(reason, "cuda_graph")
            self._stream = self.xp.cuda.Stream(non_blocking=True)  # a graph is recorded off the legacy stream

    @staticmethod
    def _array_module(sp):
        if sp.solver_mode != "GPU":
            return numpy
        try:
            return backend.gpu_array_module(sp.device_id, "solver_mode GPU")
        except LayerforgeError as e:
            if sp.line_of("solver_mode") is None:  # GPU asked for by an override (--gpu N), not by the file
                raise
            # Caffe's stock solver files say GPU: name the way to run them on this machine
            raise sp.error(f"{e}; `layerforge train --cpu` (or solver_mode: CPU) trains on the CPU",
                           "solver_mode") from None

    def add_callback(self, fn):
        """Call ``fn(iteration, loss)`` after every update (see ``callbacks``)."""
        self.callbacks.append(fn)

    def add_seam(self, seam):
        """Let data parallelism act at the points of the loop through ``seam`` (a
        :class:`~layerforge.solvers.seam.Seam`), after the seams added before it (the order is in this module's
        docstring)."""
        self.seam.add(seam)
        if seam.layer_hooks:
            self.net.backward_hooks.append(seam.layer_gradients_ready)

    @property
    def root(self):
        """Whether this replica displays, logs test scores and writes snapshots (True for one process alone)."""
        return self.seam.root

    def show_progress(self, interval):
        """Show a progress bar of the iterations (status lines every ``interval`` s when stderr is not a terminal),
        made at the first iteration so that a resumed run's rate and ETA count from where it resumed; returns the
        function that closes it."""
        from ..logs import Progress

        bar = []

        def report(iteration, loss):
            if not bar:
                bar.append(Progress(self.param.max_iter, start=iteration, interval=interval))
            bar[0].update(iteration + 1, loss)

        self.callbacks.append(report)
        return lambda: bar and bar[0].close()

    def write_scalars(self, logdir, images_per_iteration):
        """Write TensorBoard scalars of every iteration and test pass to ``logdir`` (layerforge.trace.tensorboard:
        loss, learning rate, images per second of ``images_per_iteration``, waits, test outputs); returns the
        ScalarWriter, to close after training."""
        from ..trace.tensorboard import ScalarWriter

        scalars = ScalarWriter(logdir, images_per_iteration=images_per_iteration)
        self.callbacks.append(lambda it, loss: scalars.train(it, loss, learning_rate(self.param, it)))
        self.test_hooks.append(lambda it, k, scores: scalars.test(it, scores, k))
        return scalars

    @classmethod
    def validate_params(cls, sp):
        """Rule-specific checks of a SolverParameter; raise ``sp.error(message, key)``."""

    # ------------------------------------------------------------------------------------------
    # the loop

    def step(self, iters):
        """Run ``iters`` iterations (fewer if a signal asks to stop)."""
        self._start()
        if self._stream is None:
            return self._step(iters)
        # cuda_graph: every iteration on the graphs' stream, which does not wait for the legacy stream by itself:
        # first what was queued there (weights, history, a restore), and at the end the other way round
        self._stream.wait_event(self.xp.cuda.Stream.null.record())
        try:
            with self._stream:
                self._step(iters)
        finally:
            self._stream.synchronize()

    def _start(self):
        if not self._started:  # the first iteration of this solver: the replicas agree where they start
            self._started = True
            self.iter = self.seam.start(self.iter)
            # AUTO's timing on scratch arrays, before the first counted iteration: otherwise its round-robin would
            # compute the first iterations with a mixture of engines (other last bits) where a run that found the
            # choices in the engine cache computes with the chosen ones, and the seeded runs would part
            settle_apart(self.net)

    def _step(self, iters):
        sp, seam = self.param, self.seam
        stop_iter = self.iter + int(iters)
        self._timer, self._iter_last = time.perf_counter(), self.iter
        while self.iter < stop_iter:
            trace.iteration(self.iter)
            self.net.clear_param_diffs()
            if (sp.test_interval and self.iter % sp.test_interval == 0 and (self.iter > 0 or sp.test_initialization)
                    and (seam.root or seam.shares_tests)):
                self.test_all()
                if self.requested_early_exit:
                    break
            display = seam.root and sp.display and self.iter % sp.display == 0
            loss = sum(self._forward_backward(k) for k in range(sp.iter_size)) / sp.iter_size
            loss = seam.reduce_loss(loss)
            self._update_smoothed_loss(loss)
            if display:
                self._log_train()
            if seam.before_update():
                with trace.span("update", sp.type):
                    self.apply_update(display)
            seam.after_update()
            self.iter += 1
            seam.end_iteration(self.iter - 1, loss)
            for fn in self.callbacks:
                fn(self.iter - 1, loss)
            request = self._requested_action()
            if (sp.snapshot and self.iter % sp.snapshot == 0) or request == "snapshot":
                self.snapshot()
            if request == "stop":
                self.requested_early_exit = True
                break

    def solve(self, resume_file=None, sigint_effect="stop", sighup_effect="snapshot", requests=()):
        """Train to ``max_iter`` (Caffe's Solver::Solve), optionally resuming from a ``.solverstate.npz``.

        Signals (checked once per iteration): SIGINT and SIGTERM do ``sigint_effect``, SIGHUP
        ``sighup_effect``: ``"stop"`` ends training (and, with ``snapshot_after_train``, the usual final
        snapshot is written: so Ctrl-C snapshots then returns normally), ``"snapshot"`` writes a snapshot
        and goes on, ``"none"`` installs no handler (the signal keeps its usual effect). A second Ctrl-C
        before the first is handled raises KeyboardInterrupt (in one process; ranks that agree on requests
        never raise). The previous handlers are restored on return. ``requests``: ``(signal, effect)`` pairs
        that signals made before (during start-up), carried out as if they came now.

        A TRAIN net without layers or without a loss is refused (:mod:`~layerforge.solvers.train_net`). The
        replica that writes snapshots holds the prefix's lock (:mod:`~layerforge.solvers.snapshot_lock`) until
        it returns: a second run with the same ``snapshot_prefix`` is refused before its first iteration.
        """
        sp = self.param
        refuse_untrainable(self.net, sp.path)  # (step() trains any net: `layerforge time` times deploy nets)
        if not (self.root and (sp.snapshot or sp.snapshot_after_train)):
            return self._solve(resume_file, sigint_effect, sighup_effect, requests)
        # fail now, not after hours of training, nor after replacing another run's snapshots
        with snapshot_lock.acquire(self.snapshot_prefix, sp.path, f"{sp.path or 'solver'}: snapshot_prefix"):
            return self._solve(resume_file, sigint_effect, sighup_effect, requests)

    def _solve(self, resume_file, sigint_effect, sighup_effect, requests):
        sp = self.param
        log.info("Solving %s", self.net.name)
        if self.xp is not numpy:  # Caffe's "GPU 0: <name>" line: which device trains
            device = self.xp.cuda.Device().id
            log.info("Using GPU %d: %s", device, backend.gpu_name(device))
        log.info("Learning Rate Policy: %s", sp.lr_policy.lower())
        if resume_file:
            self.restore(resume_file)
        self._start()
        self.requested_early_exit = False
        with signal_handlers(self._pending, sigint_effect, sighup_effect, escalate=not self.seam.agrees):
            self._pending[:0] = requests
            self.step(sp.max_iter - self.iter)
            if sp.snapshot_after_train and (not sp.snapshot or self.iter % sp.snapshot != 0):
                self.snapshot()
            if self.requested_early_exit:
                log.info("Optimization stopped early.")
                return
            if (self.seam.root or self.seam.shares_loss) and sp.display and self.iter % sp.display == 0:
                # Caffe's extra forward so the log shows the loss of the final weights (replicas of one batch:
                # every replica, whose losses make the whole batch's)
                self._feed(0)
                self.net.forward()
                self._update_smoothed_loss(self.seam.reduce_loss(self.net.loss))
                if self.seam.root:
                    log.info("Iteration %d, loss = %s", self.iter, _g(self.smoothed_loss))
            if (self.seam.root or self.seam.shares_tests) and sp.test_interval and self.iter % sp.test_interval == 0:
                self.test_all()
        log.info("Optimization Done.")

    def _feed(self, k):
        if self.feed is not None:
            self.net.set_inputs(**self.feed(self.iter, k))

    def _forward_backward(self, k):
        self.seam.before_pass(k)
        self._feed(k)
        if self.graphs is None and self._stream is not None and engines_settled(self.net):
            reason = cuda_graph.body_refusal(self.net, self.param.iter_size)  # seams may have come since
            if reason:
                raise LayerforgeError(reason)
            self.graphs = cuda_graph.IterationGraphs(self.net)
        if self.graphs is not None:
            return self._finite(self.graphs.forward_backward())
        with self.net.training_pass():
            self.net.forward()
            loss = self._finite(self.net.loss)
            self.net.backward()
        return loss

    def _finite(self, loss):
        """``loss``, or the one-line error of a non-finite one."""
        if not math.isfinite(loss):
            raise self.non_finite_error(f"loss is {loss}")
        return loss

    def _update_smoothed_loss(self, loss):
        # the mean of the last average_loss losses (kept across step() calls and snapshots)
        self.losses.append(float(loss))
        self.smoothed_loss = sum(self.losses) / len(self.losses)

    def _log_train(self):
        sp, net = self.param, self.net
        lapse = time.perf_counter() - self._timer
        per_s = (self.iter - self._iter_last) / (lapse or 1.0)
        images = self.images_per_iteration()
        rate = f", {per_s * images:.1f} img/s" if images else ""  # inside Caffe's brackets: its parsers read on
        log.info("Iteration %d (%s iter/s, %ss/%d iters%s), loss = %s", self.iter, _g(per_s), _g(lapse), sp.display,
                 rate, _g(self.smoothed_loss))
        iters = self.iter - self._iter_last
        # the input's window starts where the rate's does (the first display ends one with no line)
        said = self._input_line(lapse / max(iters, 1), iters) if self._input_line is not None else None
        if iters:
            for line in ([said] if said else []) + self.seam.describe(lapse / iters, iters):
                log.info("    %s", line)
        self._timer, self._iter_last = time.perf_counter(), self.iter
        log_outputs("Train", ((name, backend.to_numpy(net.blobs[name].data).reshape(-1)) for name in net.outputs),
                    output_weights(net), sp.report_perplexity)

    def images_per_iteration(self):
        """Samples one iteration trains on: the train net's batch (all replicas' together) x iter_size; None when
        the net has no Input, DummyData or data layer."""
        batch = self.net.batch_size
        return None if batch is None else batch * (self.net.split or (0, 1))[1] * self.param.iter_size

    # ------------------------------------------------------------------------------------------
    # the update

    def get_learning_rate(self):
        """The rate of the current iteration (lr policy and warm-up; see :func:`learning_rate`)."""
        return learning_rate(self.param, self.iter)

    def apply_update(self, display=False):
        """Learning rate -> clip -> normalise -> regularise -> compute_update -> data -= diff (Caffe's order).

        With ``sparse_update: lazy``, a parameter whose gradient came as rows (Embed) goes through the same
        sequence on those rows only (see :meth:`update_rows`); every other parameter, and every parameter
        with ``exact``, uses ``diff``, which holds the rows added into the full array.
        """
        rate = self.get_learning_rate()
        if display:
            log.info("Iteration %d, lr = %s", self.iter, _g(rate))
        self._lazy = self._lazy_rows()
        if self.param.clip_after_normalize:
            self.normalize()
            self.clip_gradients()
        else:
            self.clip_gradients()
            self.normalize()
        params = self.net.learnable_params
        share = self.seam.update_share()
        share = dict.fromkeys(range(len(params))) if share is None else share
        for i in self._lazy:
            if i in share:
                self.update_rows(i, rate, self._lazy[i])
        # every other parameter's update is element-wise and independent of the rest: on the host each parameter
        # goes in blocks, whose regularisation, rule and step run while the block is in the cache (and whose
        # temporaries are reused, not faulted in), and the blocks of all parameters go to the kernel threads in
        # groups of about equal size, so that one large parameter (VGG-16's fc6 holds 74% of its values) does not
        # leave the other threads idle; the same operations per value, so the same bits for any block and count
        block = UPDATE_BLOCK if self.xp is numpy else None
        parts = [(i, part) for i in share if i not in self._lazy for part in _parts(params[i], share[i], block)]
        sizes = [params[i].count if part is None else part[1] - part[0] for i, part in parts]
        groups = balanced_groups(sizes, num_threads())

        def update(lo, hi):
            for group in groups[lo:hi]:
                for k in group:
                    i, part = parts[k]
                    arrays, state = self._part(i, part)
                    decay, lr = self._decay_and_rate(i, rate)
                    if not self.fused_update(arrays, state, lr, decay):
                        self._update(i, arrays, state, rate)
                        arrays.data -= arrays.diff
        parallel_for(len(groups), update, work=sum(sizes) if self.xp is numpy else 0)

    def fused_update(self, param, state, rate, decay):
        """Regularise (``decay``), the rule (``rate``) and the step ``data -= diff`` of ``param`` in one pass, with the
        bits of :meth:`regularize`, :meth:`compute_update` and the step: the rule's :meth:`compiled_step`, on the host
        with L2 or no decay; False (nothing done) where not, and the three run one after the other."""
        if self.xp is not numpy or (decay and self.param.regularization_type != "L2") or \
                not _compiled_step_is_the_rule(type(self)):
            return False
        return self.compiled_step(param, state, rate, decay)

    def compiled_step(self, param, state, rate, decay):
        """The rule's one compiled pass (kernels/update.py) over host arrays; False where the rule has none or it does
        not take these arrays."""
        return False

    def _decay_and_rate(self, i, rate):
        # parameter i's weight decay (weight_decay x decay_mult) and learning rate (the iteration's x lr_mult)
        return self.param.weight_decay * self.net.params_weight_decay[i], rate * self.net.params_lr[i]

    def _update(self, i, param, state, rate):
        # regularise, then the rule: the step for parameter i (or its block or rows ``param``) is left in param.diff
        decay, lr = self._decay_and_rate(i, rate)
        self.regularize(param, decay)
        self.compute_update(param, state, lr)

    def _part(self, i, part):
        """``(ParamArrays, state)`` of the values ``part`` of parameter ``i`` (``(start, stop)`` of its flattened values,
        :func:`_parts`, or None for all): flat views of the parameter and its state, the diff combined (the seam)."""
        p, state = self.net.learnable_params[i], self.state[i]
        self.seam.combine_gradient(i, part)
        if part is None:
            return ParamArrays(p.data, p.diff), state
        cut = slice(*part)
        return ParamArrays(p.data.reshape(-1)[cut], p.diff.reshape(-1)[cut]), [h.reshape(-1)[cut] for h in state]

    @property
    def history(self):
        """The rule's state arrays in Caffe's layout (what a solver state file holds): ``history[k * n + i]`` is the
        k-th state array of learnable parameter i, n parameters; the arrays themselves (a restore writes into them)."""
        return [state[k] for k in range(self.history_per_param) for state in self.state]

    def adopt_history(self, arrays):
        """Keep the rule's state in ``arrays`` from now on (Caffe's layout, as :attr:`history`; the same shapes),
        with the values they hold: CPU replicas train on one copy of it in shared memory."""
        n = len(self.state)
        self.state = [[arrays[k * n + i] for k in range(self.history_per_param)] for i in range(n)]

    def _lazy_rows(self):
        if self.param.sparse_update != "LAZY":
            return {}
        return {i: p.sparse_diff() for i, p in enumerate(self.net.learnable_params) if p.sparse_rows}

    def _gradients(self):
        # the arrays clip and normalise scale: the rows of lazily updated parameters, else the full diffs
        lazy = self._lazy
        return [lazy[i].rows if i in lazy else p.diff for i, p in enumerate(self.net.learnable_params)]

    def normalize(self):
        if self.param.iter_size > 1:
            for g in self._gradients():
                g *= 1.0 / self.param.iter_size

    def clip_gradients(self):
        c = self.param.clip_gradients
        if c < 0:
            return
        gradients = self._gradients()  # a row gradient's indices are unique, so its rows give the same norm
        norm = math.sqrt(sum(float((g * g).sum()) for g in gradients))
        if norm > c:
            scale = c / norm
            log.info("Gradient clipping: scaling down gradients (L2 norm %s > %s) by scale factor %s",
                     _g(norm), _g(c), _g(scale))
            for g in gradients:
                g *= scale

    def regularize(self, param, decay):
        """Add the weight decay's gradient to ``param.diff`` (a :class:`ParamArrays`): ``decay * data`` (L2) or
        ``decay * sign(data)`` (L1), ``decay`` being weight_decay x the parameter's decay_mult."""
        if not decay:
            return
        if self.param.regularization_type == "L2":
            param.diff += decay * param.data
        else:
            param.diff += decay * self.xp.sign(param.data)

    def update_rows(self, i, rate, grad):
        """``sparse_update: lazy`` for parameter ``i`` with the row gradient ``grad`` (a SparseGradient).

        Only the rows ``grad.indices`` change: their weights, their state (momentum, Adam's moments, the
        squared-gradient sums) and their weight decay; every other row is left as it is, as if its gradient
        had not been computed (TensorFlow's LazyAdam, PyTorch's SparseAdam; Adam's t still counts every
        iteration). :meth:`regularize` and the rule's :meth:`compute_update` run unchanged on the gathered
        rows and their gathered state; the results are scattered back (the indices are unique).
        """
        p, idx = self.net.learnable_params[i], grad.indices
        rows, state = ParamArrays(p.data[idx], grad.rows), [h[idx] for h in self.state[i]]
        self._update(i, rows, state, rate)
        for h, gathered in zip(self.state[i], state):
            h[idx] = gathered
        p.data[idx] -= rows.diff

    def compute_update(self, param, state, rate):
        """The rule: turn ``param.diff`` (a :class:`ParamArrays`, the regularised gradient) into the step to subtract,
        in place, updating its ``state`` (the parameter's ``history_per_param`` arrays, of param's shape) in place.

        ``rate`` is this parameter's learning rate: the iteration's rate x its ``lr_mult``. ``param`` and ``state``
        may be a whole parameter, a block of its elements or its rows with a gradient: every rule is element-wise.
        """
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------
    # testing

    def test_all(self):
        for k in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            log.info("Iteration %d, Testing net (#%d)", self.iter, k)
            with trace.span("test", f"test net {k}"):
                self.test(k)
        return self.test_scores

    def test(self, k=0):
        """Forward test net ``k`` test_iter[k] times; log and return ``{output: mean value}`` (with ``eval_type``
        DETECTION, ``{output: mAP}``; solvers/evaluation.py scores them)."""
        net, n = self.test_nets[k], self.param.test_iter[k]
        scores = evaluate(self.param, net, self._test_batches(net, n), n, self.seam)
        if scores is None:
            return None
        self.test_scores[k] = scores
        for hook in self.test_hooks:
            hook(self.iter, k, scores)
        return scores

    def _test_batches(self, net, n):
        """Run ``n`` test forwards (acting on signal requests between them); yields after each. Sets
        ``requested_early_exit`` and stops on a stop request."""
        for _ in range(n):
            request = self._requested_action()
            while request != "none":
                if request == "snapshot":
                    self.snapshot()
                else:
                    self.requested_early_exit = True
                request = self._requested_action()
            if self.requested_early_exit:
                log.info("Test interrupted.")
                return
            forward_settled(net)  # the scores repeat whether the engines were timed now or came from the cache
            yield

    # ------------------------------------------------------------------------------------------
    # weights, snapshots, resuming

    def share_activations(self):
        """Let the activations of the train and test nets share storage (``Net.optimize_memory``), as ``layerforge
        train`` does unless ``--no-reuse``: after a pass their intermediate blobs hold other blobs' values, which no
        one reads from the command line (tests read the outputs; the Python interface, ``import caffe``, keeps each
        blob's own, as Caffe does). ResNet-50's train net at batch 8: 572 MiB of activations against 1,380; where a
        Split's consumers can, they make its sum. Logs the two figures of each net."""
        from ..logs import format_bytes
        from ..net.memory import memory_report

        for net in [self.net] + list(self.test_nets):
            net.optimize_memory()
            report = memory_report(net)
            log.info("%s %s: activations %s in shared storage (%s each in its own)", net.name, net.phase,
                     format_bytes(report["activation_bytes"]), format_bytes(report["unplanned_activation_bytes"]))

    def check_memory(self, processes=1):
        """Refuse to start (LayerforgeError) when ``processes`` copies of the nets' blobs, parameters and buffers
        (replicas: each its own) need more than the machine's memory.

        Arrays are allocated lazily (pages are touched in the first iterations), so building the nets can succeed
        where training would be killed by the system: this says so before the first iteration.
        """
        from ..logs import format_bytes
        from ..net.memory import memory_report

        if self.xp.__name__ != "numpy":
            return
        need = processes * sum(memory_report(net)["peak_bytes"] for net in [self.net] + list(self.test_nets))
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if need > total:
            raise LayerforgeError(f"{self.param.path or 'solver'}: the nets need {format_bytes(need)} of memory "
                                  f"(data, gradients, parameters and buffers), more than this machine's "
                                  f"{format_bytes(total)}; use a smaller batch (layerforge summary shows the sizes)")

    def load_weights(self, path):
        """Start from trained weights (Caffe's ``-weights``): copied by layer name into every net."""
        for p in str(path).split(","):
            self.net.copy_from(p)
            for tn in self.test_nets:
                tn.copy_from(p)

    def snapshot(self):
        """Write PREFIX_iter_N.npz (weights) and PREFIX_iter_N.solverstate.npz, each atomically (or Caffe's
        .caffemodel and .solverstate, with their .h5 flavours, as ``snapshot_format`` says).

        Returns the solver-state path (None on non-root ranks). Non-finite weights are never written.
        """
        with trace.span("snapshot", f"iteration {self.iter}"):
            self.seam.before_snapshot()
            path = snapshots.snapshot(self)
        self.seam.after_snapshot()
        return path

    def state_arrays(self, learned_net=""):
        """The solver state as ``{name: array}`` (no pickles: JSON strings in 0-d arrays)."""
        return snapshots.state_arrays(self, learned_net)

    def restore(self, path):
        """Resume from a ``.solverstate.npz``: weights, iteration, history, random stream, data positions.

        A Caffe ``.solverstate`` (or ``.solverstate.h5``) restores weights, iteration and history only."""
        return snapshots.restore(self, path)

    # ------------------------------------------------------------------------------------------
    # signals and non-finite values

    def _requested_action(self):
        return self.seam.agree(self._pending.pop(0)[1] if self._pending else "none")

    def non_finite_error(self, what, scan=True):
        # after the fact, an in-place chain (ip1 -> relu1 in place) shows its last writer's values under
        # the first layer's name: the report names the chain's producer
        culprit = ""
        net = self.net
        for i, layer in enumerate(net.layers if scan else []):
            if not all(snapshots.finite(b.data) for b in layer.blobs):
                culprit = f"; the parameters of layer '{layer.name}' ({layer.type}) are non-finite"
                break
            bad = [n for n, b in zip(net.top_names(i), net.top_blobs(i)) if not snapshots.finite(b.data)]
            if bad:
                culprit = f"; first layer with a non-finite output: '{layer.name}' ({layer.type}), top '{bad[0]}'"
                break
        kept = f"the last good snapshot is {self.last_snapshot}" if self.last_snapshot else "no snapshot was written"
        return NonFiniteError(f"iteration {self.iter}: {what}{culprit}; training stopped ({kept})")


UPDATE_BLOCK = 1 << 18  # elements of a parameter the update takes at a time on the host (1 MiB of float32)


def _parts(param, rows, block):
    """The element ranges of ``param`` (its ``rows``: a slice of the first axis, or None for all) to update one at
    a time: blocks of ``block`` elements (None: the whole range); None for the whole parameter in one piece."""
    count = int(param.count)
    per_row = count // int(param.shape[0]) if len(param.shape) and param.shape[0] else count
    start, stop = (0, count) if rows is None else (rows.start * per_row, rows.stop * per_row)
    flat = param.data.flags.c_contiguous and param.diff.flags.c_contiguous  # flat views, not copies
    if (start, stop) == (0, count) and (block is None or count <= block or not flat):
        return [None]
    step = block or stop - start
    return [(a, min(stop, a + step)) for a in range(start, stop, step)]


@functools.lru_cache(maxsize=None)
def _compiled_step_is_the_rule(solver_class):
    """Whether the class's compiled_step computes its passes: False for a subclass (a user's) that redefines a pass
    (regularize, compute_update, accumulate) below the class the compiled step comes from; that subclass's own passes
    run."""
    for cls in solver_class.__mro__:
        names = vars(cls)
        if "compiled_step" in names:
            return True
        if "regularize" in names or "compute_update" in names or "accumulate" in names:
            return False
    return True


def balanced_groups(sizes, count):
    """The indices of ``sizes`` dealt into at most ``count`` groups of about equal total size, largest first."""
    groups, totals = [[] for _ in range(max(1, count))], [0] * max(1, count)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        k = totals.index(min(totals))
        groups[k].append(i)
        totals[k] += sizes[i]
    return [sorted(g) for g in groups if g]


def _net_state(state):
    # Caffe merges train_state / test_state into the net's own state: a level given replaces it, stages add
    if state is None:
        return {}
    return {"level": state.level if state.given("level") else None, "stages": state.stage}
