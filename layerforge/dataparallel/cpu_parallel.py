"""How a CPU run uses the cores: one process on every core, or one single-threaded replica per core.

``THREADS``: one process; BLAS and the kernel threads (layerforge/kernels/threadpool.py) split every operation
over the cores, and the non-GEMM bodies split the minibatch (or the channels) between them.

``REPLICAS``: R = cores processes, each single-threaded, each computing batch / R of every batch: CGDP's host
mode with a split batch (layerforge/dataparallel/cgdp: each gradient chunk is averaged on the host while backward
goes on, the replicas share one copy of the parameters and of the update history and split the update). One
thread per replica has no GEMM split in two and no Python between the BLAS calls left waiting for a core; the
price is the exchange and each replica's own activations.

``AUTO`` (the default): ``REPLICAS`` where the replicas compute what one process computes
(:func:`replica_refusal`) and a short timed trial of both runs it faster, within :data:`REPLICA_MEMORY_LIMIT` times
one process's memory (the trial's peak resident memory of each, dataparallel/peak_memory.py), else ``THREADS``.
The choice is remembered per machine, net, batch and solver in ``cpu_parallel.json`` beside AUTO's engine cache
(layerforge/kernels/engine_cache.py), so only a net's first run pays for the trial, and a run of train shorter
than :data:`SHORT_RUN` iterations pays nothing (``THREADS`` unless a choice is remembered); the solver key
``cpu_parallel`` or ``layerforge train --cpu-parallel`` forces either. The choice is logged in one line.

The replicas are mathematically one process with the whole batch: replica g of R trains on samples
g, g + R, ... of what the data layers read (their shard), Dropout draws its mask for the whole batch and
keeps its samples' rows, the losses are normalised by the batch so the mean of the R gradients is the whole batch's,
and every parameter gets one update from that mean; BatchNorm normalises with the whole batch's statistics,
exchanged per layer (layerforge/dataparallel/cgdp/replica_sum.py). What that needs of a net is checked, not
assumed.
"""
import hashlib
import json
import logging
import os
import time

import numpy

from ..errors import ConfigError, LayerforgeError, interrupting
from ..kernels.engine_cache import ChoiceCache, machine_key
from ..kernels.workspace import free_arenas

log = logging.getLogger("layerforge")

CACHE = ChoiceCache("cpu_parallel.json", "CPU parallelism cache")
TRIAL_ITERATIONS = 3  # timed iterations per configuration, after the warm-up
# the trial costs some 10 to 50 iterations (warm-ups, timed ones, starting the replicas): a shorter run of train
# could not win it back, so AUTO keeps THREADS for it untimed (a remembered choice still holds)
SHORT_RUN = 100
MARGIN = 1.03  # replicas hold more memory and processes: they must win by more than the trial's noise
# nor may they hold more than this times one process's peak memory: each replica has its own gradients, workspaces and
# runtime. Two replicas of AlexNet (61 M parameters) held 1.9x what THREADS did and LeNet's 2.5x (the runtime of a
# second process), ResNet-50's at batch 8 1.3-1.5x (its activations, split between them, dominate), VGG-16's at batch 4
# 1.7x, which was 1.53x PyTorch's peak; PyTorch holds 1.1-1.5x what THREADS does on those nets, so within 1.6x the
# replicas stay within about 1.5x PyTorch's memory
REPLICA_MEMORY_LIMIT = 1.6

# Layer types whose output for a sample depends only on that sample (and the parameters), so R replicas on
# batch / R compute what one process computes on the batch; the dict value names the block whose ``axis``
# must not be the batch axis. BatchNorm is here because the replicas exchange its statistics. Types not listed
# (Reduction, recurrent layers, Embed, Python layers, MemoryData, ...) are refused by name.
PER_SAMPLE = {
    "Convolution": "convolution", "Deconvolution": "convolution", "Pooling": None, "SPP": None, "Im2col": None,
    "InnerProduct": "inner_product", "Scale": "scale", "Bias": "bias", "PReLU": None, "LRN": None, "MVN": None,
    "ReLU": None, "Sigmoid": None, "TanH": None, "ELU": None, "AbsVal": None, "BNLL": None, "Clip": None,
    "Exp": None, "Log": None, "Power": None, "Swish": None, "Threshold": None, "Dropout": None,
    "Eltwise": None, "Split": None, "Concat": "concat", "Slice": "slice", "Flatten": "flatten", "Crop": "crop",
    "Tile": "tile", "Softmax": "softmax", "ArgMax": "argmax", "Silence": None, "Accuracy": "accuracy",
    "SoftmaxWithLoss": "softmax", "InfogainLoss": "infogain_loss", "MultinomialLogisticLoss": None,
    "SigmoidCrossEntropyLoss": None, "EuclideanLoss": None, "ContrastiveLoss": None, "HingeLoss": None,
    "Input": None, "Data": None, "ImageData": None, "DenseImageData": None, "HDF5Data": None, "DummyData": None, "SyntheticData": None,
    "BatchNorm": None, "AnnotatedData": None, "PriorBox": None, "Normalize": None, "Permute": None,
    "MultiBoxLoss": None, "CPMData": None,
}
NORMALISED = ("SoftmaxWithLoss", "InfogainLoss", "SigmoidCrossEntropyLoss")  # loss.normalization applies


class Choice:
    """The configuration a CPU run uses.

    Attributes:
        mode: ``"THREADS"`` or ``"REPLICAS"``; replicas: processes (1 for THREADS); why: a sentence.
        quiet: nothing was chosen (AUTO on a short run keeps the one process): ``layerforge train`` logs no line.
    """

    def __init__(self, mode, replicas, why, quiet=False):
        self.mode, self.replicas, self.why, self.quiet = mode, replicas, why, quiet

    def describe(self):
        """One log line."""
        how = (f"{self.replicas} single-threaded replicas, each on 1/{self.replicas} of the batch"
               if self.mode == "REPLICAS" else f"one process on {cores()} cores")
        return f"CPU parallelism: {self.mode}, {how} ({self.why})"


def cores():
    """Cores a run may use: the BLAS thread setting (layerforge.cores divides a node between MPI ranks),
    at most the cores this process may run on."""
    from ..kernels.threadpool import num_threads

    return max(1, min(num_threads(), len(os.sched_getaffinity(0))))


def train_layers(sp, batch=None):
    """The LayerParameters of the TRAIN net of the SolverParameter ``sp``, as its Net includes them (with batch
    ``batch`` when not None)."""
    from ..layers.layer_param import layer_included
    from ..net.netdef import load_net_def, set_batch_size

    netdef = load_net_def(sp.train_net_source())
    if batch is not None:
        set_batch_size(netdef, batch)
    state = sp.train_state
    level = state.level if state is not None and state.given("level") else netdef.state.level
    stages = tuple(netdef.state.stage) + tuple(state.stage if state is not None else ())
    return [lp for lp in netdef.layers if layer_included(lp, "TRAIN", level, stages)]


def replica_refusal(layers, replicas):
    """Why ``replicas`` replicas on batch / replicas would not compute what one process computes on the whole
    batch (a sentence naming the layer), or None."""
    from ..layers import LAYER_REGISTRY
    from ..net.netdef import DATA_BLOCKS, batch_sizes

    sizes = batch_sizes(layers)
    if not sizes:
        return "the net has no Input or data layer to split"
    for lp, key, size in sizes:
        if size != sizes[0][2]:
            return f"layer '{lp.name}' has batch {size} ({key}), layer '{sizes[0][0].name}' {sizes[0][2]}"
        if size % replicas:
            return f"batch {size} (layer '{lp.name}') does not split into {replicas} equal replica batches"
    for lp in layers:
        where = f"layer '{lp.name}' ({lp.type})"
        if lp.type not in PER_SAMPLE:
            return f"{where} is not known to treat the samples of a batch independently"
        block = PER_SAMPLE[lp.type] and getattr(lp, PER_SAMPLE[lp.type])
        axis = block.axis if block else 1
        for legacy in ("concat_dim", "slice_dim"):
            if block and block.given(legacy):
                axis = getattr(block, legacy)
        if axis is not None and axis < 1:
            return f"{where} works along axis {axis}, which is or may be the batch axis"
        if lp.type == "Pooling" and lp.pooling.pool == "STOCHASTIC":
            return f"{where} draws its stochastic pooling per replica"
        if any(getattr(getattr(lp, block, None), "rand_skip", 0) for block in DATA_BLOCKS):
            return f"{where} skips a random number of records in each replica's shard"
        if lp.type == "Permute" and lp.permute.order and lp.permute.order[0] != 0:
            return f"{where} moves the batch axis (order {lp.permute.order})"
        if lp.type == "MultiBoxLoss" and LAYER_REGISTRY[lp.type].normalization_of(lp.loss) == "NONE":
            return f"{where} sums the loss: the mean of the replicas' gradients would not be the batch's"
        if lp.type in NORMALISED:
            norm = LAYER_REGISTRY[lp.type].normalization_of(lp.loss)
            if norm == "NONE" or (norm == "VALID" and lp.loss.ignore_label is not None):
                why = "sums the loss" if norm == "NONE" else "divides by the count of labels not ignored"
                return f"{where} {why}: the mean of the replicas' gradients would not be the batch's"
    return None


def resume_refusal(path, replicas):
    """Why ``replicas`` replicas could not resume the solver state ``path`` (a sentence naming the data layer whose
    read position does not split into equal replica shares), or None; also None for a file the run will refuse
    itself (unreadable, Caffe's, no positions)."""
    import zipfile

    try:
        with numpy.load(path, allow_pickle=False) as state:
            layers = json.loads(state["data_state"].item()).get("train", {})
        positions = [(name, int(s["position"])) for name, s in layers.items() if "position" in s]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, RecursionError, zipfile.BadZipFile):
        return None
    for name, position in positions:
        if position % replicas:
            return (f"layer '{name}' of {path} read {position} records, which do not split into {replicas} equal "
                    "replica shares")
    return None


# the replicas' revision in a choice's key: choices timed against earlier replicas are timed again. 2: replicas that
# make the mean in their update post one chunk when backward ends (cgdp/chunks.WHOLE), 3-4% faster on ResNet-50;
# 3: the trial's nets share their activations' storage, as layerforge train's now do (Solver.share_activations)
REPLICAS_REVISION = 3


def choice_key(sp, layers, replicas):
    """What a choice was timed for: the TRAIN layers as written (a digest), the batch, dtype, rule and R, the GEMM
    precision where it is not fp32 (bfloat16 operands change what each configuration costs) and the replicas'
    revision (:data:`REPLICAS_REVISION`)."""
    from ..net.netdef import batch_sizes

    written = json.dumps([lp.source for lp in layers], sort_keys=True, default=str)
    digest = hashlib.sha256(written.encode()).hexdigest()[:16]
    sizes = batch_sizes(layers)
    batch = sizes[0][2] if sizes else 0
    precision = (sp.gemm_precision or os.environ.get("LAYERFORGE_GEMM_PRECISION") or "fp32").lower()
    return (f"layers={digest}|batch={batch}|iter_size={sp.iter_size}|{sp.dtype.lower()}|solver={sp.type}"
            f"|replicas={replicas}|revision={REPLICAS_REVISION}"
            + (f"|gemm_precision={precision}" if precision != "fp32" else ""))


def choose(sp, layers, requested, measure, replicas=None, run=None, resume=None):
    """The configuration for the solver ``sp`` whose TRAIN net has ``layers``.

    Args:
        requested: ``"AUTO"``, ``"THREADS"`` or ``"REPLICAS"`` (the solver key, or the command line's).
        measure: ``measure(mode, replicas) -> (images per second, peak resident bytes)`` of a short trial (AUTO,
            not cached); a peak of 0 is unknown (no memory rule).
        replicas: the replica count (default: :func:`cores`).
        run: the iterations the choice is for (``layerforge train``: max_iter), or None; AUTO times no trial
            for fewer than :data:`SHORT_RUN`.
        resume: the solver state the run resumes (``layerforge train --snapshot``), or None.

    Returns a :class:`Choice`; ConfigError when REPLICAS is asked for a net it would change. A trial that fails
    with the user's error (LayerforgeError) leaves THREADS, remembered nowhere: the run itself then reports it
    as one process does. A Ctrl-C or SIGTERM during a trial ends the command (errors.Interrupted),
    whatever the trial then did: neither its cut-short figure nor a failure the signal caused (a replica it killed)
    is remembered, or taken for THREADS.
    """
    replicas = cores() if replicas is None else replicas
    if requested == "THREADS":
        return Choice("THREADS", 1, "cpu_parallel: THREADS")
    refusal = "one core" if replicas < 2 else replica_refusal(layers, replicas) or (
        resume and resume_refusal(resume, replicas))
    if requested == "REPLICAS":
        if refusal:
            raise ConfigError(f"cpu_parallel REPLICAS would not train as one process does: {refusal}", sp.path,
                              sp.line_of("cpu_parallel"), key="cpu_parallel")
        return Choice("REPLICAS", replicas, "cpu_parallel: REPLICAS")
    if refusal:
        return Choice("THREADS", 1, f"replicas would not be one process: {refusal}")
    machine, key = machine_key(numpy), choice_key(sp, layers, replicas)
    cached = CACHE.lookup(machine, key)
    if cached is not None and cached.get("mode") in ("THREADS", "REPLICAS"):
        mode = cached["mode"]
        return Choice(mode, replicas if mode == "REPLICAS" else 1,
                      f"remembered from a trial: {cached.get('trial', '?')}")
    if run is not None and run < SHORT_RUN:
        return Choice("THREADS", 1, f"a run of {run} iterations, too short for a trial", quiet=True)
    try:
        with interrupting():  # a Ctrl-C ends the command: neither a cut-short figure nor the failure it caused counts
            threads_rate, threads_peak = measure("THREADS", 1)
    except LayerforgeError:  # the run will meet it again and say it, with its log, as one process does
        return Choice("THREADS", 1, "the trial failed")
    try:
        with interrupting():
            replicas_rate, replicas_peak = measure("REPLICAS", replicas)
    except LayerforgeError as e:  # the net ran in one process: train it so, and time the replicas next time
        log.warning("CPU parallelism: the replicas' trial failed (%s)", e)
        return Choice("THREADS", 1, "the replicas' trial failed")
    memory = replicas_peak / threads_peak if replicas_peak and threads_peak else None
    mode = "REPLICAS" if replicas_rate > MARGIN * threads_rate and (
        memory is None or memory <= REPLICA_MEMORY_LIMIT) else "THREADS"
    trial = f"{replicas_rate:.2f} img/s with {replicas} replicas, {threads_rate:.2f} img/s with threads"
    if memory is not None:
        trial += f"; the replicas' peak memory {memory:.2f}x one process's ({replicas_peak / 2 ** 20:.0f} MiB)"
    CACHE.store(machine, key, {"mode": mode, "trial": trial})
    return Choice(mode, replicas if mode == "REPLICAS" else 1, f"trial: {trial}")


def resolve(source, overrides=None, requested=None, measure=None, batch=None, training=False, resume=None):
    """The configuration ``layerforge train --solver`` uses on a CPU (see the module docstring).

    Args:
        source: the solver: a SolverParameter (as train reads it once), or a YAML path or dict to read;
            overrides: solver key overrides (``max_iter=...``).
        requested: the command line's ``--cpu-parallel``, overriding the solver's ``cpu_parallel``.
        measure: replaces the timed trial (tests: ``measure(mode, replicas) -> images/s``).
        batch: the batch size instead of the net's (``layerforge time --batch``).
        training: the choice is for a run of the solver's max_iter iterations (``layerforge train``), which AUTO
            does not time when shorter than :data:`SHORT_RUN`; resume: the solver state it resumes, or None.

    Returns a :class:`Choice`, or None when the solver runs on a GPU.
    """
    from ..solvers.param import load_solver_param
    from ..solvers.solver import SOLVER_REGISTRY
    from ..cores import mpi_world_size

    sp = load_solver_param(source, SOLVER_REGISTRY, **dict(overrides or {}))
    requested = (requested or sp.cpu_parallel).upper()
    elsewhere = ("the solver runs on a GPU" if sp.solver_mode == "GPU" else
                 "under mpiexec every rank is one process" if mpi_world_size() > 1 else None)
    if elsewhere:
        if requested == "REPLICAS":
            raise ConfigError(f"cpu_parallel REPLICAS is for a CPU run of one process: {elsewhere}", sp.path,
                              sp.line_of("cpu_parallel"), key="cpu_parallel")
        return None if sp.solver_mode == "GPU" else Choice("THREADS", 1, elsewhere)
    if measure is None:
        measure = timed_trial(sp, batch)
    return choose(sp, train_layers(sp, batch), requested, measure, run=sp.max_iter if training else None,
                  resume=resume)


# ------------------------------------------------------------------------------------------------------------
# the timed trial

WARM_UP_LIMIT = 20  # warm-up iterations at most, until AUTO's convolutions have chosen their engines


def timed_trial(sp, batch=None):
    """``measure(mode, replicas)`` of :func:`choose` for the SolverParameter ``sp``: the timed trial, said in the log
    (what it times and, once the first iteration has run, about how long it takes), and the peak resident memory of
    this process and its children while it runs (THREADS: this process; REPLICAS: it and the replicas)."""
    took, base = {}, own_memory()  # this process before any trial

    def measure(mode, replicas):
        if mode == "THREADS":
            log.info("CPU parallelism: a trial times THREADS, then REPLICAS (%d replicas), on a throwaway copy of the "
                     "net: iterations until AUTO has chosen the convolution engines (at most %d), then %d timed; once "
                     "per net, batch and machine (--cpu-parallel THREADS or REPLICAS skips it)", cores(),
                     WARM_UP_LIMIT, TRIAL_ITERATIONS)
        else:
            about = f", about {took['THREADS']:.0f} s as THREADS took" if "THREADS" in took else ""
            log.info("CPU parallelism: timing REPLICAS, %d single-threaded replicas%s", replicas, about)
        t0 = time.perf_counter()
        measured = with_peak_memory(lambda: trial(sp, mode, replicas, batch=batch), base)
        took[mode] = time.perf_counter() - t0
        return measured
    return measure


def own_memory():
    """Resident bytes of this process now (private and file-backed pages and shared memory; 0 without /proc)."""
    from .peak_memory import resident

    return sum(resident(os.getpid()))


def with_peak_memory(run, base):
    """``(run(), peak bytes)``: the peak resident memory of this process and its children while ``run`` runs, as
    what it added to ``base`` (this process's memory before the trials; not what an earlier trial left here)."""
    from .peak_memory import PeakMemory

    start, memory = own_memory(), PeakMemory(os.getpid())
    try:
        result = run()
    finally:
        peak = memory.stop()
    return result, base + max(0, peak - start)


def announce_trial(seconds, passes_left):
    """The trial's line once its first iteration has run (``seconds``), with ``passes_left`` warm-up iterations
    before the timed ones."""
    left = (passes_left + TRIAL_ITERATIONS) * seconds
    log.info("CPU parallelism: timing THREADS: the first iteration took %.1f s, about %.0f s to go (%d more warm-up "
             "iteration(s), %d timed)", seconds, left, passes_left, TRIAL_ITERATIONS)

# a trial trains a throwaway copy: no display, testing or snapshots
QUIET = dict(display=0, test_interval=0, test_initialization=False, snapshot=0, snapshot_after_train=False,
             max_iter=10 ** 9)


def warm_up(solver, limit=WARM_UP_LIMIT, announce=None):
    """Iterations of ``solver`` until every AUTO convolution has chosen its engines (at least one); returns
    how many ran. ``announce(seconds, passes_left)`` is told the first iteration's time (:func:`announce_trial`)."""
    from ..kernels.autotune import passes_to_settle, settle_engines

    def one_pass(k):
        t0 = time.perf_counter()
        solver.step(1)
        if k == 0 and announce is not None:
            announce(time.perf_counter() - t0, min(passes_to_settle(solver.net), limit - 1))
    return settle_engines(solver.net, one_pass, limit)


def warm_up_replica(g, solver, limit=WARM_UP_LIMIT):
    """WorkerOptions.setup of a trial: forward-backward passes of replica ``g`` until its AUTO convolutions
    have chosen (before the replicas start exchanging), so the timed iterations use the choice."""
    from ..kernels.autotune import settle_engines

    net = solver.net
    settle_engines(net, lambda k: (net.forward(), net.backward()), limit)
    net.clear_param_diffs()


def plan_and_warm_up_replica(g, solver):
    """:func:`warm_up_replica` after planning the net's activation memory (``Net.optimize_memory``)."""
    solver.net.optimize_memory()
    warm_up_replica(g, solver)


def trial(sp, mode, replicas, iterations=TRIAL_ITERATIONS, batch=None):
    """Images per second of full training iterations (forward, backward, exchange, update) of a throwaway
    copy of the solver of the SolverParameter ``sp`` in ``mode``: the fastest of ``iterations`` after the warm-up
    (as timeit does: other work on the machine only ever slows an iteration down)."""
    from ..solvers import SOLVER_REGISTRY, load_solver_param

    quiet = load_solver_param(sp, SOLVER_REGISTRY, **QUIET)
    if mode == "REPLICAS":  # the nets share their activations' storage, as layerforge train's do
        return replicas_rate(quiet, replicas, iterations, batch=batch, setup=plan_and_warm_up_replica)
    from .cgdp.workers import build_solver

    solver = build_solver(quiet, {}, batch)
    try:
        solver.net.optimize_memory()
        solver.check_memory()
        return threads_rate(solver, iterations, announce=announce_trial)
    finally:
        close_data_layers(solver)
        free_arenas()  # the throwaway net's workspaces


def threads_rate(solver, iterations, best=True, announce=None):
    """Images per second of full iterations of the Solver ``solver`` in this process, after the warm-up
    (:func:`warm_up`, which tells ``announce``): the fastest of ``iterations`` (``best``) or their mean."""
    warm_up(solver, announce=announce)
    times = iteration_times(solver, iterations)
    return solver.images_per_iteration() / (min(times) if best else sum(times) / len(times))


def iteration_times(solver, iterations):
    """The seconds each of ``iterations`` whole training iterations of ``solver`` takes, one after another."""
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        solver.step(1)
        times.append(time.perf_counter() - t0)
    return times


def replicas_rate(source, replicas, iterations, batch=None, setup=warm_up_replica, best=True):
    """Images per second of the solver of ``source`` (a SolverParameter, or a path or dict) trained by ``replicas``
    replicas on a split batch (whole batch ``batch`` when not None): the fastest (``best``) or the mean of
    ``iterations`` whole iterations, timed between the ends of two iterations' exchanges, after a first one."""
    from .cgdp import train_parallel

    result = train_parallel(source, workers=replicas, sync="host", chunk_size=1, split=True, setup=setup,
                            iterations=iterations + 1, batch=batch, log=False)
    times = result.iteration_times[-iterations:] or [result.stats["phases_ms"]["iteration"] / 1000.0]  # no chunks
    seconds = min(times) if best else sum(times) / len(times)
    if not seconds > 0:
        raise LayerforgeError("the replicas' trial measured no iteration time")
    return result.stats["images_per_iteration"] / seconds


def close_data_layers(solver):
    """Stop the data layers' prefetch threads of a solver that is no longer used."""
    for net in [solver.net] + list(solver.test_nets):
        for layer in net.layers:
            if hasattr(layer, "close"):
                layer.close()
