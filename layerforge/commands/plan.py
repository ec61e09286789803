"""``layerforge plan --solver S --nodes N --group Q``: predicted data-parallel iteration time per allreduce.

With ``--workers 2,4,8`` instead: the CGDP cost model (docs/cgdp.md) for G workers on one host, host mode
against the tree baseline, from a host-mode timing run (plan_workers).

Model (weak scaling, batch b per rank): one iteration = the net's forward-backward time T_c (measured
here, or read from ``layerforge time --json``) + one allreduce of all gradients, n bytes, whose time the
alpha-beta-gamma model of layerforge.comm.cost_model predicts for p = N ranks in groups of Q. The model
takes the exchange after backward (the bound without overlap, which hides at most T_c of it), so
efficiency = T_c / (T_c + T_allreduce) and the speed-up over one rank is p * efficiency. Beside it: the
iteration with the exchange overlapped with the last backward pass (``allreduce_overlap``: T_c - T_b +
max(T_b, T_allreduce), T_b that pass's backward) and with ``double_buffering`` (max(T_c, T_allreduce): the
exchange runs through the whole next iteration); both assume communication takes no compute time. Parameters with row gradients (Embed) are left out of n unless
``sparse_aggregation`` is dense: their rows per rank and in the sum are measured over N forward-backward
passes, and the sparse path's predicted time (the solver's choice, or the cheapest for auto) is added.
"""
import json
import logging

import numpy

from .. import backend
from ..errors import LayerforgeError
from ..logs import setup_logging

log = logging.getLogger("layerforge")

HELP = "predict data-parallel iteration time, efficiency and throughput per allreduce algorithm at N ranks"

ALGORITHMS = ("recursive", "topology", "ring", "doubling", "hierarchical", "mpi")


def add_arguments(parser):
    parser.add_argument("--solver", required=True, help="solver YAML (its train net and batch size)")
    parser.add_argument("--nodes", type=int, help="number of ranks p (MPI data parallel)")
    parser.add_argument("--workers", metavar="LIST", help="instead: host vs tree (CGDP) for these worker counts on "
                        "one host, e.g. 2,4,8 (--timing: a `layerforge time --workers G --json` output)")
    parser.add_argument("--devices", metavar="LIST", help="with --workers: time on these GPUs (default: 2 CPU workers)")
    parser.add_argument("--group", type=int, default=1, help="ranks per node group q (default 1)")
    parser.add_argument("--timing", help="`layerforge time --json` output for the train net (default: time it now)")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations when timing now")
    parser.add_argument("--cost", help="alpha,beta_intra,beta_inter,gamma in seconds (per byte for the betas and "
                                       "gamma); default: the calibration cache written by bench_allreduce/train")
    parser.add_argument("--json", action="store_true")


def load_cost_params(spec, nodes=None):
    """``(CostParams, where from)``: from ``"a,bi,bx,g"``, or from the calibration cache: the entry measured with
    ``nodes`` ranks, else the one measured with most ranks, the rank count said in ``where from`` (the model's
    per-message and per-byte costs then stand for those of ``nodes`` ranks)."""
    from ..comm.cost_model import CostParams, cache_path

    if spec:
        try:
            values = [float(v) for v in spec.split(",")]
        except ValueError:
            values = []
        if len(values) != 4:
            raise LayerforgeError(f"--cost '{spec}': give four numbers alpha,beta_intra,beta_inter,gamma")
        return CostParams(*values), "--cost"
    path = cache_path()
    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, ValueError):
        raise LayerforgeError(f"{path}: no calibration yet: run `mpiexec -n 4 layerforge bench_allreduce` once, "
                              "or give --cost alpha,beta_intra,beta_inter,gamma") from None

    def ranks(key):
        part = [p for p in key.split("|") if p.startswith("p=")]
        return int(part[0][2:]) if part else 0

    exact = [k for k in table if ranks(k) == nodes]
    key = exact[0] if exact else max(table, key=ranks)
    note = "" if exact or nodes is None else (
        f", measured with {ranks(key)} ranks, not {nodes}: `mpiexec -n {nodes} layerforge bench_allreduce` "
        "measures these")
    return CostParams.from_dict(table[key]), f"{path} [{key}]{note}"


def read_timing(path):
    """The JSON written by ``layerforge time --json`` at ``path``; a one-line error if it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise LayerforgeError(f"{path}: cannot read the timing JSON: {e}") from None


def sparse_plan(net, sp, p, q, params):
    """Per parameter with row gradients (Embed): rows per rank and in the sum, measured over p forward-backward
    passes (the batches p ranks would see), and the predicted ms of every sparse path.

    Returns ``[{name, rows_per_rank, rows_in_sum, num_rows, ms: {path: ms}, chosen}]``; empty when
    ``sparse_aggregation`` is dense (the rows then travel in the dense allreduce).
    """
    from ..comm.cost_model import SPARSE_PATHS, choose_sparse, predict_sparse

    sparse = [b for b in net.learnable_params if b.sparse_rows]
    if not sparse or sp.sparse_aggregation == "DENSE":
        return []
    seen = {id(b): [] for b in sparse}
    for _ in range(p):
        net.clear_param_diffs()
        net.forward()
        net.backward()
        for b in sparse:
            seen[id(b)].append(backend.to_numpy(b.sparse_diff().indices))
    net.clear_param_diffs()
    out = []
    for b in sparse:
        counts = [len(i) for i in seen[id(b)]]
        union = len(numpy.unique(numpy.concatenate(seen[id(b)])))
        row_bytes = int(numpy.prod(b.shape[1:], dtype=numpy.int64)) * b.dtype.itemsize
        args = (counts, union, row_bytes, b.shape[0], q, params)
        chosen = choose_sparse(*args) if sp.sparse_aggregation == "AUTO" else sp.sparse_aggregation.lower()
        out.append({"name": b.name, "rows_per_rank": max(counts), "rows_in_sum": union, "num_rows": b.shape[0],
                    "ms": {path: predict_sparse(path, *args) * 1000.0 for path in SPARSE_PATHS}, "chosen": chosen})
    return out


def predict_plan(compute_ms, grad_bytes, p, q, params, batch, sparse_ms=0.0, backward_ms=None):
    """Rows ``{algorithm, allreduce_ms, iteration_ms, efficiency, speedup, images_per_s, overlapped_ms,
    double_buffered_ms}`` per algorithm (module docstring); ``sparse_ms`` (the chosen sparse paths) is added
    to every row's exchange time; ``backward_ms``: the last pass's backward (default: all of compute_ms)."""
    backward_ms = compute_ms if backward_ms is None else backward_ms
    from ..comm.cost_model import predict

    rows = []
    for name in ALGORITHMS:
        ar = predict(name, grad_bytes, p, q, params) * 1000.0 + sparse_ms
        it = compute_ms + ar
        eff = compute_ms / it if it > 0 else 1.0
        rows.append({"algorithm": name, "allreduce_ms": ar, "iteration_ms": it, "efficiency": eff,
                     "speedup": p * eff, "images_per_s": p * batch / (it / 1000.0) if it > 0 else 0.0,
                     "overlapped_ms": compute_ms - backward_ms + max(backward_ms, ar),
                     "double_buffered_ms": max(compute_ms, ar)})
    return rows


def run(args):
    from ..net.net import Net
    from ..solvers.param import load_solver_param
    from ..solvers import SOLVER_REGISTRY
    from .summary import batch_size
    from .time import time_net

    if args.workers:
        return plan_workers(args)
    if args.nodes is None:
        raise LayerforgeError("give --nodes N (MPI ranks) or --workers LIST (workers on one host)")
    if args.nodes < 1 or args.group < 1 or args.group > args.nodes:
        raise LayerforgeError(f"need 1 <= --group ({args.group}) <= --nodes ({args.nodes})")
    setup_logging()  # what takes a while (timing the net) is said on stderr; the plan goes to stdout
    sp = load_solver_param(args.solver, SOLVER_REGISTRY)
    params, source_of_params = load_cost_params(args.cost, args.nodes)  # before the timing: a missing one fails now
    net = Net(sp.train_net_source(), phase="train", dtype=sp.dtype.lower())
    if not args.timing:
        log.info("plan: timing the train net of %s for its forward-backward time (--timing FILE, a `layerforge time "
                 "--json` output, skips this)", args.solver)
    timing = read_timing(args.timing) if args.timing else time_net(net, args.iterations)
    compute_ms = float(timing["forward_backward_ms"]) * sp.iter_size
    itemsize = 2 if sp.allreduce_fp16 else net.dtype.itemsize
    batch = batch_size(net)
    sparse = sparse_plan(net, sp, args.nodes, args.group, params)
    sparse_names = {s["name"] for s in sparse}
    grad_bytes = sum(b.count for b in net.learnable_params if b.name not in sparse_names) * itemsize
    rows = predict_plan(compute_ms, grad_bytes, args.nodes, args.group, params, batch * sp.iter_size,
                        sum(s["ms"][s["chosen"]] for s in sparse), float(timing.get("backward_ms", compute_ms)))
    if args.json:
        print(json.dumps({"nodes": args.nodes, "group": args.group, "compute_ms": compute_ms,
                          "gradient_bytes": grad_bytes, "cost_params": params.to_dict(), "rows": rows,
                          "sparse": sparse}, indent=1))
        return 0
    print(f"net '{net.name}': forward-backward {compute_ms:.1f} ms per iteration per rank (batch {batch} x iter_size "
          f"{sp.iter_size}), gradients {grad_bytes / 2 ** 20:.2f} MiB")
    print(f"p = {args.nodes} ranks in groups of {args.group}; alpha {params.alpha * 1e6:.2f} us, beta_intra "
          f"{1 / params.beta_intra / 1e9 if params.beta_intra else float('inf'):.2f} GB/s, beta_inter "
          f"{1 / params.beta_inter / 1e9 if params.beta_inter else float('inf'):.2f} GB/s, gamma "
          f"{1 / params.gamma / 1e9 if params.gamma else float('inf'):.2f} GB/s (from {source_of_params})")
    for s in sparse:
        paths = ", ".join(f"{path} {ms:.2f} ms" for path, ms in s["ms"].items())
        print(f"row gradients of {s['name']}: {s['rows_per_rank']} of {s['num_rows']} rows per rank, "
              f"{s['rows_in_sum']} in the sum; {paths}; {s['chosen']} (sparse_aggregation "
              f"{sp.sparse_aggregation.lower()}), added to every allreduce below")
    print(f"{'algorithm':10s} {'allreduce ms':>13s} {'iteration ms':>13s} {'efficiency':>11s} {'speed-up':>9s} "
          f"{'images/s':>10s} {'overlapped ms':>14s} {'double-buf. ms':>15s}")
    for r in rows:
        print(f"{r['algorithm']:10s} {r['allreduce_ms']:13.2f} {r['iteration_ms']:13.2f} {100 * r['efficiency']:10.1f}% "
              f"{r['speedup']:9.1f} {r['images_per_s']:10.1f} {r['overlapped_ms']:14.2f} {r['double_buffered_ms']:15.2f}")
    return 0


def plan_workers(args):
    """``layerforge plan --solver S --workers 2,4,8``: host vs tree per G, from a host-mode timing run.

    The run is ``--timing`` (``layerforge time --workers G --json`` output) or one made now: 2 workers (or
    the ``--devices``), host mode, chunk size 1, ``--iterations`` after a warm-up.
    """
    from ..dataparallel.cgdp import train_parallel
    from ..dataparallel.cgdp.cost_model import predict_rows
    from .data_parallel import prediction_text

    try:
        Gs = [int(g) for g in args.workers.split(",")]
    except ValueError:
        Gs = []
    if not Gs or min(Gs) < 1:
        raise LayerforgeError(f"--workers '{args.workers}': give worker counts >= 1, e.g. 2,4,8")
    if args.timing:
        stats = read_timing(args.timing)
        if stats.get("sync") != "HOST" or "rates" not in stats or "units" not in stats:
            raise LayerforgeError(f"{args.timing}: not a host-mode `layerforge time --workers G --json` output")
    else:
        setup_logging()
        log.info("plan: timing %s workers in host mode, %d iterations after a warm-up, for the cost model (--timing "
                 "FILE, a `layerforge time --workers G --json` output, skips this)", args.devices or 2, args.iterations)
        stats = train_parallel(args.solver, workers=None if args.devices else 2, devices=args.devices, sync="host",
                               chunk_size=1, iterations=args.iterations + 1, log=False, snapshot=0,
                               snapshot_after_train=False, test_interval=0, display=0).stats
    if not stats.get("rates"):
        raise LayerforgeError(f"{args.solver}: the net has no learnable parameters: nothing to exchange")
    parameters = sum(n for _, _, n in stats["units"])
    if args.json:
        print(json.dumps({"measured": {"G": stats["G"], "phases_ms": stats["phases_ms"], "rates": stats["rates"],
                                       "parameters": parameters}, "rows": predict_rows(stats, Gs)}, indent=1))
        return 0
    ph, r = stats["phases_ms"], stats["rates"]
    print(f"measured with {stats['G']} workers, host mode (worker 0, ms per iteration): forward {ph['forward']:.1f}, "
          f"backward {ph['backward']:.1f}, update {ph['update']:.1f}; {parameters:,} parameters")
    print("rates (ns per value): " + ", ".join(f"{k.replace('_', ' ')} {1e9 * v:.3f}" for k, v in r.items()))
    print(prediction_text(stats, Gs))
    return 0
