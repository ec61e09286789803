"""``layerforge time --model NET.yaml``: per-layer forward/backward timing, like ``caffe time``.

Per-layer figures come from passes with a timer around every layer; the forward / backward totals come
from separate passes timed as a whole, so they do not include the per-layer timers' own overhead.
Warm-up runs until every AUTO convolution has chosen its engines, so the timed passes use the choice.

Memory: unless ``--no-reuse``, the net shares activation storage (``Net.optimize_memory``). The peak of a
training iteration is counted, not sampled: activation arrays (after sharing; the unshared figure
too) + parameter data and diffs + what layers hold (convolution workspaces and every cached array,
see ``layerforge.net.memory``). The process's RSS high-water mark (``ru_maxrss``) is printed beside it: it
includes the interpreter, numpy, BLAS buffers and temporaries that the count does not see.

Training iterations: in the train phase (and not under ``mpiexec``) whole iterations (forward, backward, the
exchange of replicas, the momentum-SGD update) are timed too, in the configuration ``layerforge train`` uses
on this machine (``cpu_parallel``: the remembered choice, or its trial; ``--cpu-parallel`` forces one):
``images_per_second`` in the JSON, and a line of the table.

Under ``mpiexec -n P`` every rank times its replica and then runs whole data-parallel iterations (forward,
backward, gradient exchange; no update), once with the exchange after backward and once overlapped with it:
rank 0 prints the iteration time, the communication time and the part of it the iteration waited for
(exposed), both ways.
"""
import json
import os
import resource
import sys
import time

import logging

import numpy

from . import add_collective_timeout, add_decode_workers, add_net_state, apply_decode_workers, net_state, \
    train_state
from ..cores import local_rank, mpi_world_size
from .. import trace
from ..backend import Stopwatch, gpu_array_module, gpu_name, rank_device
from ..kernels.autotune import passes_to_settle, settle_engines
from ..layers.data import input_stats, reset_input_stats
from ..errors import LayerforgeError
from ..net.memory import layer_bytes
from ..net.net import Net
from ..net.netdef import load_net_def, set_batch_size
from ..logs import format_shape, setup_logging
from .summary import print_table

log = logging.getLogger("layerforge")

HELP = "time each layer's forward and backward passes and print a table with totals"


def add_arguments(parser):
    add_decode_workers(parser)
    parser.add_argument("--model", required=True, help="the net (YAML, or Caffe's .prototxt)")
    parser.add_argument("--iterations", type=int, default=20, help="timed iterations, after warm-up passes (at least 1, up to 20 until AUTO convolution engines settle)")
    parser.add_argument("--batch", type=int, default=None, help="override the batch size of input/data layers")
    parser.add_argument("--phase", choices=("train", "test"), default="train")
    parser.add_argument("--weights", metavar="FILE",
                        help="copy these weights in first (.npz, .caffemodel, .caffemodel.h5)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--gpu", type=int, metavar="N", help="build and time the net on GPU N (device times, "
                        "CUDA events)")
    from .data_parallel import add_parallel_arguments
    from .trace import add_run_arguments

    add_run_arguments(parser)  # --trace FILE of the passes --trace-iterations names (warm-up passes count)
    add_net_state(parser)
    add_parallel_arguments(parser)  # with --workers/--devices: phases and per-chunk exchange times (docs/cgdp.md)
    parser.add_argument("--no-reuse", action="store_true", help="give every activation its own storage")
    from .train import add_cpu_parallel_argument

    add_cpu_parallel_argument(parser)
    parser.add_argument("--allreduce", default="auto", help="under mpiexec: the allreduce of the exchange")
    parser.add_argument("--bucket-mb", type=float, default=4.0,
                        help="under mpiexec: bucket size of the exchange in MiB (0: one buffer)")
    add_collective_timeout(parser, "under mpiexec: its barriers, exchanges and the trace's clock exchanges; default 600")


def time_net(net, iterations):
    """Time ``net``; returns a dict with per-layer rows and totals (milliseconds per iteration).

    On a GPU net (cupy) the times are device times between CUDA events, waited for after every layer
    (as ``caffe time`` does), and ``device_pool_bytes`` is what cupy's memory pool holds afterwards.
    """
    n = len(net.layers)
    fwd, bwd = [0.0] * n, [0.0] * n
    log.info("Timing net '%s': forward-backward passes until AUTO has chosen the convolution engines (at most %d, and "
             "one more where a pass chose), then %d passes timed layer by layer and %d timed whole", net.name,
             WARM_UP_LIMIT, iterations, iterations)
    warmups = warm_up(net, iterations=iterations)
    watch = Stopwatch(net.xp)
    for k in range(iterations):  # each a training pass, as the solver's (Net.training_pass)
        trace.iteration(warmups + k)
        with net.training_pass():
            for i in range(n):
                watch.start()
                net.forward_layer(i)
                fwd[i] += watch.stop()
            for i in reversed(range(n)):
                watch.start()
                net.backward_layer(i)
                bwd[i] += watch.stop()
    total_fwd = total_bwd = 0.0
    reset_input_stats(net)
    for k in range(iterations):
        trace.iteration(warmups + iterations + k)
        with net.training_pass():
            watch.start()
            net.forward()
            total_fwd += watch.stop()
            watch.start()
            net.backward()
            total_bwd += watch.stop()
    stats = input_stats(net)
    ms = 1000.0 / iterations
    layer_sum = sum(fwd) + sum(bwd)
    rows = []
    for i, layer in enumerate(net.layers):
        macs = layer.multiply_adds(net.bottom_blobs(i), net.top_blobs(i))
        f, b = fwd[i] * ms, bwd[i] * ms
        rows.append({
            "layer": layer.name, "type": layer.type,
            "top_shape": [list(t.shape) for t in net.top_blobs(i)],
            "forward_ms": f, "backward_ms": b,
            "share": (fwd[i] + bwd[i]) / layer_sum if layer_sum else 0.0,
            "forward_gflops": 2 * macs / (f * 1e6) if f > 0 and macs else 0.0,
            "backward_gflops": 4 * macs / (b * 1e6) if b > 0 and macs and net.layer_need_backward[i] else 0.0,
            "engine": "/".join(k or "?" for k in engine_choice(layer)),
            "workspace_bytes": layer_bytes(layer),
        })
    memory = net.memory_report()
    memory.pop("per_layer_bytes")
    return {"net": net.name, "iterations": iterations, "warmup_iterations": warmups, "layers": rows,
            "forward_ms": total_fwd * ms, "backward_ms": total_bwd * ms,
            "forward_backward_ms": (total_fwd + total_bwd) * ms, "memory": memory,
            "max_rss_bytes": max_rss_bytes(), "input": stats.as_dict(), **device_memory(net.xp)}


def device_memory(xp):
    """``{"device": name, "device_pool_bytes": bytes held by cupy's pool}`` for a cupy net, {} for numpy."""
    if xp.__name__ != "cupy":
        return {}
    return {"device": gpu_name(xp.cuda.Device().id),
            "device_pool_bytes": int(xp.get_default_memory_pool().total_bytes())}


def time_exchange(net, comm, iterations, algorithm="auto", bucket_mb=4.0):
    """Data-parallel iterations of ``net`` over ``comm`` with the exchange after backward and overlapped.

    Returns ``{"after": {...}, "overlapped": {...}}``, each with ``iteration_ms``, ``comm_ms`` and
    ``exposed_ms`` per iteration (maxima over ranks).
    """
    import numpy
    from mpi4py import MPI

    from ..dataparallel.gradient_exchange import GradientExchange, gradient_ready_after

    params = net.learnable_params
    out = {}
    for mode, overlap in (("after", False), ("overlapped", True)):
        exchange = GradientExchange(params, comm, algorithm, bucket_bytes=int(bucket_mb * 2 ** 20),
                                    ready_after=gradient_ready_after(net, params), overlap=overlap)
        net.add_hooks(after_backward=exchange.layer_gradients_ready)
        try:
            for k in range(iterations + 1):  # the first one warms the buffers and the algorithm up
                if k == 1:
                    exchange.comm_seconds = exchange.exposed_seconds = 0.0
                    comm.barrier()
                    t0 = time.perf_counter()
                net.clear_param_diffs()
                exchange.before_pass(0)  # one pass per iteration: overlapped, its backward sends the buckets
                net.forward()
                net.backward()
                exchange.before_update()
            elapsed = time.perf_counter() - t0
        finally:
            net.remove_hooks(after_backward=exchange.layer_gradients_ready)
        figures = numpy.array([elapsed, exchange.comm_seconds, exchange.exposed_seconds]) * 1000.0 / iterations
        with comm.collective("allreduce of the timings"):
            comm.comm.Allreduce(MPI.IN_PLACE, figures, op=MPI.MAX)
        out[mode] = dict(zip(("iteration_ms", "comm_ms", "exposed_ms"), map(float, figures)))
    return out


def job_communicator(args):
    """The job's Communicator under mpiexec, with ``--collective-timeout``'s deadline (docs/distributed.md): a rank
    that does not come to a barrier, an exchange or the trace's clock exchange is named, and the job ends."""
    from ..comm import Communicator
    from ..comm.deadline import DEFAULT_TIMEOUT

    return Communicator(timeout=DEFAULT_TIMEOUT if args.collective_timeout is None else args.collective_timeout)


TRAINING_SOLVER = {"type": "SGD", "base_lr": 0.001, "momentum": 0.9}  # the update of the timed iterations


def training_solver(args, netdef, device):
    """The solver whose iterations are timed: momentum SGD over ``netdef`` (its net is the one timed by layer)."""
    from ..solvers import SOLVER_REGISTRY
    from ..solvers.param import load_solver_param

    on_device = {} if device is None else {"solver_mode": "GPU", "device_id": device}
    sp = load_solver_param(dict(TRAINING_SOLVER, net=os.path.abspath(args.model), **on_device, **train_state(args)),
                           SOLVER_REGISTRY)
    sp.net_param, sp.net = netdef, None
    solver = SOLVER_REGISTRY[sp.type](sp)
    if args.weights:
        solver.load_weights(args.weights)
    return solver


def time_training(args, solver):
    """``{"training": {...}, "images_per_second": ...}``: whole iterations of ``solver`` as ``layerforge train``
    runs them here (one process, or replicas: layerforge/dataparallel/cpu_parallel.py)."""
    from ..dataparallel import cpu_parallel
    from ..solvers import SOLVER_REGISTRY, load_solver_param

    iterations, rates = args.iterations, {}
    sp = load_solver_param(dict(TRAINING_SOLVER, net=os.path.abspath(args.model), **train_state(args)),
                           SOLVER_REGISTRY)
    setup = cpu_parallel.warm_up_replica if args.no_reuse else cpu_parallel.plan_and_warm_up_replica

    base = cpu_parallel.own_memory()

    def measure(mode, replicas):  # (images per second, peak resident bytes), as cpu_parallel.timed_trial's
        if mode not in rates:
            rates[mode] = cpu_parallel.with_peak_memory(
                lambda: cpu_parallel.threads_rate(solver, iterations, best=False) if mode == "THREADS" else
                cpu_parallel.replicas_rate(sp, replicas, iterations, args.batch, setup, best=False), base)
        return rates[mode]

    choice = cpu_parallel.Choice("THREADS", 1, "on a GPU") if solver.xp is not numpy else \
        cpu_parallel.resolve(sp, requested=args.cpu_parallel, measure=measure, batch=args.batch)
    rate = measure(choice.mode, choice.replicas)[0]
    training = {"cpu_parallel": choice.mode, "replicas": choice.replicas, "why": choice.why,
                "iteration_ms": 1000.0 * solver.images_per_iteration() / rate, "images_per_second": rate}
    return {"training": training, "images_per_second": rate}


WARM_UP_LIMIT = 20


def warm_up(net, limit=WARM_UP_LIMIT, iterations=None):
    """Forward-backward passes until every AUTO convolution has chosen its engines (at least one pass), and then one
    more where a pass chose; the first pass's time and what is left are logged when it took more than a second.

    The passes are training passes, as the timed ones are (``Net.training_pass``), so a timed pass never makes the
    first of what a training pass alone holds (Winograd's kept input tiles: with the choices from the engine cache
    and one warm-up pass outside a training pass, the first timed pass of ResNet-50 at batch 4 took about 10 ms more
    in each Winograd layer's forward, and 4 timed passes' rows of those layers 0.6-3.6 ms more; docs/performance.md).
    Returns the number of passes; timings taken before then would include AUTO's trials of both engines.
    """
    def one_pass(k):
        trace.iteration(k)
        t0 = time.perf_counter()
        with net.training_pass():
            net.forward()
            net.backward()
        seconds = time.perf_counter() - t0
        if k == 0 and seconds > 1.0:
            left = min(passes_to_settle(net), limit - 1)
            left += left > 0  # the pass after the choice
            log.info("Timing net '%s': the first pass took %.1f s; %d more warm-up pass(es)%s", net.name,
                     seconds, left, "" if iterations is None else
                     f", then {2 * iterations} timed: about {(left + 2 * iterations) * seconds:.0f} s to go")

    passes = settle_engines(net, one_pass, limit)
    if passes > 1:  # the last pass chose: its engines' first training pass with their choice is this one
        one_pass(passes)
        passes += 1
    return passes


def engine_choice(layer):
    """``(forward, backward)`` engine names of a layer with engines (None until AUTO settles); () otherwise."""
    choice = getattr(layer, "engine_choice", None)
    return (choice["forward"], choice["backward"]) if choice else ()


def max_rss_bytes():
    """The process's resident-set high-water mark (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def mib(n):
    return f"{n / 2 ** 20:.1f} MiB"


def run(args):
    apply_decode_workers(args)
    setup_logging()  # what takes a while (AUTO's timing, a trial) is said on stderr; the figures go to stdout
    from .data_parallel import time_command, wants_parallel

    if wants_parallel(args):
        if args.gpu is not None:
            raise LayerforgeError("--gpu N times one net on one GPU; --workers/--devices time data parallelism "
                                  "(give the GPUs to --devices)")
        if args.level is not None or args.stage:
            raise LayerforgeError("--level / --stage choose the layers of one net; with --workers/--devices give "
                                  "the net's state in its file (state: {level, stage})")
        return time_command(args)
    netdef = load_net_def(args.model)
    if args.batch is not None:
        set_batch_size(netdef, args.batch)
    device = None if args.gpu is None else rank_device(args.gpu, local_rank() if mpi_world_size() > 1 else 0)
    xp = numpy if device is None else gpu_array_module(device, "--gpu")
    training = args.phase == "train" and mpi_world_size() <= 1
    if training:
        solver = training_solver(args, netdef, device)
        net = solver.net
    else:
        net = Net(netdef, phase=args.phase, weights=args.weights, xp=xp, **net_state(args))
    if not args.no_reuse:
        net.optimize_memory()
    comm = job_communicator(args) if mpi_world_size() > 1 else None
    if args.trace:
        trace.start(args.trace, trace.parse_window(args.trace_iterations or "%d:%d" % trace.DEFAULT_WINDOW),
                    comm=comm and comm.comm, xp=xp, deadline=comm and comm.deadline)
    result = time_net(net, args.iterations)
    if args.trace:
        trace.finish(comm=comm and comm.comm)
    if training and solver.images_per_iteration() is not None:  # a net with no batch has no images/s to time
        result.update(time_training(args, solver))
    if comm is not None:
        result["data_parallel"] = dict(ranks=comm.size, allreduce=args.allreduce, bucket_mb=args.bucket_mb,
                                       **time_exchange(net, comm, args.iterations, args.allreduce, args.bucket_mb))
        if comm.rank != 0:
            return 0
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    header = ("layer", "type", "top shape", "forward ms", "backward ms", "share", "fwd GFLOP/s", "bwd GFLOP/s",
              "engine fwd/bwd", "workspace")
    table = [(r["layer"], r["type"], " ".join(format_shape(s) for s in r["top_shape"]),
              f"{r['forward_ms']:.3f}", f"{r['backward_ms']:.3f}", f"{100 * r['share']:.1f}%",
              f"{r['forward_gflops']:.2f}" if r["forward_gflops"] else "-",
              f"{r['backward_gflops']:.2f}" if r["backward_gflops"] else "-",
              r["engine"] or "-", mib(r["workspace_bytes"]) if r["workspace_bytes"] else "-")
             for r in result["layers"]]
    where = f" on {result['device']} (device times)" if "device" in result else ""
    print(f"Timing net '{net.name}' ({args.phase}){where}, {args.iterations} iterations after "
          f"{result['warmup_iterations']} warm-up")
    print_table(header, table)
    print(f"Average Forward pass: {result['forward_ms']:.3f} ms.")
    print(f"Average Backward pass: {result['backward_ms']:.3f} ms.")
    print(f"Average Forward-Backward: {result['forward_backward_ms']:.3f} ms.")
    m = result["memory"]
    print(f"Peak memory of a training iteration (counted): {mib(m['peak_bytes'])} = activations "
          f"{mib(m['activation_bytes'])} ({'shared' if not args.no_reuse else 'not shared'}; unshared "
          f"{mib(m['unplanned_activation_bytes'])}) + parameters {mib(m['param_bytes'])} + layer caches "
          f"{mib(m['cache_bytes'])} + shared convolution workspace {mib(m['workspace_bytes'])}.")
    print(f"Process max RSS: {mib(result['max_rss_bytes'])}.")
    if result["input"]["batches"]:
        stats = input_stats(net)
        print(f"Input: {stats.summary()}; {1e3 * stats.wait_s / args.iterations:.3f} ms waited per iteration.")
        if stats.warning():
            print(f"Warning: {stats.warning()}")
    t = result.get("training")
    if t:
        how = "one process" if t["cpu_parallel"] == "THREADS" else f"{t['replicas']} replicas"
        print(f"Training iteration (forward, backward, exchange, update) as train runs it, {t['cpu_parallel']} "
              f"({how}; {t['why']}): {t['iteration_ms']:.3f} ms, {t['images_per_second']:.2f} images/s.")
    if "device_pool_bytes" in result:
        print(f"Device memory held by cupy's pool: {mib(result['device_pool_bytes'])}.")
    dp = result.get("data_parallel")
    if dp:
        print(f"Data parallel over {dp['ranks']} ranks (allreduce {dp['allreduce']}, {dp['bucket_mb']:g} MiB buckets; "
              "maxima over ranks, per iteration):")
        for mode in ("after", "overlapped"):
            f = dp[mode]
            share = 100 * f["exposed_ms"] / f["iteration_ms"] if f["iteration_ms"] else 0.0
            print(f"  exchange {mode + ' backward' if mode == 'after' else 'with backward'}: iteration "
                  f"{f['iteration_ms']:.3f} ms, communication {f['comm_ms']:.3f} ms, exposed {f['exposed_ms']:.3f} "
                  f"ms ({share:.1f}% of the iteration)")
    return 0
