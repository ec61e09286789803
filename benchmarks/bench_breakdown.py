"""Where a training iteration's time goes, layerforge beside PyTorch CPU, by kind of operation.

    python benchmarks/bench_breakdown.py [--nets resnet50,alexnet] [--threads 2] [--iterations 3] [--replicas 2]
                                         [--precision fp32|bf16] [--interference]

The nets are bench_train.py's (one definition builds both frameworks' nets). layerforge: `layerforge time`'s
per-layer forward and backward times (``commands.time.time_net``), summed by layer type, plus the SGD
solver's update timed on its own. PyTorch: the profiler's self CPU time per aten operator over the same
iterations, mapped to the same kinds; what maps to no kind (autograd's bookkeeping, LRN's pieces, the
adds of Split's gradients, fills) is "other". Each framework runs in its own subprocess with ``--threads``
BLAS / intra-op threads. Milliseconds per iteration.

``--replicas R``: layerforge as one of R single-threaded replicas of the batch (cpu_parallel REPLICAS): R
subprocesses at once, each with one thread and batch / R (so that they contend for the memory and caches as
the replicas do), the update of one replica's share of the parameters; replica 0's times. The exchange of
the gradients, which a replica waits for only at the end of backward, is not in the table (``layerforge time``
and the trainer's phases give it).

``--precision bf16``: layerforge with ``gemm_precision: BF16`` against PyTorch under bfloat16 autocast, as
bench_train.py's; torch's casts (``aten::_to_copy`` and its kin) are in "other".

``--interference`` (with ``--replicas R``): what the replicas cost each other, layerforge alone. Replica 0's layers
alone on the machine (one process, one thread, batch / R), then with the R - 1 others beside it as above, then alone
again; a row per kind of layer (convolutions by kernel, stride and engine) and the layers that lose the most, alone
(the mean of the two runs) against together. The R processes start together and run the same layers in the same
order, so each layer meets the others' same layer, as the replicas of a training run do (they start each iteration
together); the whole passes that ``layerforge time`` runs after its per-layer passes are printed too.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KINDS = ("convolution", "batch norm + scale + relu", "pooling", "lrn", "inner product", "eltwise / split",
         "update", "other")
LAYER_KIND = {"Convolution": "convolution", "BatchNorm": "batch norm + scale + relu",
              "Scale": "batch norm + scale + relu", "ReLU": "batch norm + scale + relu", "Pooling": "pooling",
              "LRN": "lrn", "InnerProduct": "inner product", "Eltwise": "eltwise / split", "Split": "eltwise / split"}
# aten operator -> (kind, pass)
TORCH_KIND = {
    "aten::mkldnn_convolution": ("convolution", "forward"), "aten::convolution_backward": ("convolution", "backward"),
    # what one thread (or a shape oneDNN does not take) runs instead: im2col + GEMM
    "aten::_slow_conv2d_forward": ("convolution", "forward"),
    "aten::_slow_conv2d_backward": ("convolution", "backward"),
    "aten::add_": ("eltwise / split", "backward"),  # autograd's sum of a blob's gradients (Caffe's Split)
    "aten::native_batch_norm": ("batch norm + scale + relu", "forward"),
    "aten::native_batch_norm_backward": ("batch norm + scale + relu", "backward"),
    "aten::clamp_min": ("batch norm + scale + relu", "forward"), "aten::relu": ("batch norm + scale + relu", "forward"),
    "aten::threshold_backward": ("batch norm + scale + relu", "backward"),
    "aten::max_pool2d_with_indices": ("pooling", "forward"),
    "aten::max_pool2d_with_indices_backward": ("pooling", "backward"),
    "aten::mean": ("pooling", "forward"), "aten::addmm": ("inner product", "forward"),
    "aten::mm": ("inner product", "backward"), "aten::add": ("eltwise / split", "forward"),
}


def run_layerforge(name, iterations, replicas=1, precision="fp32"):
    sys.path.insert(0, ROOT)
    sys.path.insert(0, HERE)
    import bench_train
    from layerforge.commands.time import time_net
    from layerforge.dataparallel.cgdp.host import update_shares
    from layerforge.solvers.seam import Seam

    solver = bench_train.layerforge_solver(name, batch=bench_train.BATCH[name] // replicas, precision=precision)
    share = update_shares(solver.net.learnable_params, replicas)[0]

    class FirstReplica(Seam):  # the update of replica 0 of ``replicas`` sharing one copy of the parameters
        def update_share(self):
            return share

    solver.add_seam(FirstReplica())
    net = solver.net
    timing = time_net(net, iterations)
    out = collections.defaultdict(lambda: [0.0, 0.0])
    layers = []
    for layer, row in zip(net.layers, timing["layers"]):
        kind = LAYER_KIND.get(row["type"], "other")
        out[kind][0] += row["forward_ms"]
        out[kind][1] += row["backward_ms"]
        layers.append([row["layer"], _finer_kind(layer, row), row["forward_ms"], row["backward_ms"]])
    solver.apply_update()
    t0 = time.perf_counter()
    for _ in range(iterations):
        solver.apply_update()
    out["update"][1] += (time.perf_counter() - t0) * 1e3 / iterations
    return {"kinds": dict(out), "layers": layers, "whole_ms": timing["forward_backward_ms"]}


def _finer_kind(layer, row):
    """A layer's row in --interference's table: a convolution by kernel, stride and engines (``3x3/2 IMPLICIT``),
    any other layer by its type."""
    if row["type"] != "Convolution":
        return row["type"]
    kh, kw, sy, sx = layer.geometry[:4]
    stride = f"/{sy}" if (sy, sx) != (1, 1) else ""
    engines = row["engine"].split("/")
    return f"{kh}x{kw}{stride} {engines[0] if len(set(engines)) == 1 else row['engine']}"


def run_torch(name, iterations, threads, precision="fp32"):
    import torch
    from torch.profiler import ProfilerActivity, profile
    sys.path.insert(0, HERE)
    import bench_train

    torch.set_num_threads(threads)
    shape, nodes = bench_train.NETS[name]()
    batch = bench_train.BATCH[name]
    model = bench_train.torch_module(nodes, shape)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    x, y = torch.randn(batch, shape[0], shape[1], shape[1]), torch.randint(0, shape[2], (batch,))

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iterations):
            step()
    out = collections.defaultdict(lambda: [0.0, 0.0])
    total = 0.0
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1e3 / iterations
        if event.key.startswith("Optimizer.step"):
            out["update"][1] += event.cpu_time_total / 1e3 / iterations
            continue
        if not event.key.startswith("aten::"):
            continue
        total += ms
        kind, which = TORCH_KIND.get(event.key, ("other", "forward"))
        out[kind][0 if which == "forward" else 1] += ms
    # the optimizer's own aten calls were counted above as well: take them out of "other"
    out["other"][0] = max(0.0, out["other"][0] - out["update"][1])
    return {"kinds": dict(out)}


def child(args):
    result = run_layerforge(args.net, args.iterations, args.replicas, args.precision) \
        if args.child == "layerforge" else run_torch(args.net, args.iterations, args.threads, args.precision)
    print(json.dumps(result))


def measure(framework, net, iterations, threads, replicas=1, precision="fp32", processes=None):
    """One child's figures; with ``replicas`` > 1 that many single-threaded children at once (``processes`` of them
    where given: 1 for replica 0 alone), replica 0's."""
    threads = 1 if replicas > 1 else threads
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", framework, "--net", net,
                               "--iterations", str(iterations), "--threads", str(threads), "--replicas",
                               str(replicas), "--precision", precision], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(replicas if processes is None else processes)]
    outputs = [proc.communicate() for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        if proc.returncode:
            sys.exit(f"{framework} {net} failed:\n{err[-3000:]}")
    return json.loads(outputs[0][0].strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="resnet50,alexnet")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1,
                        help="layerforge as one of this many single-threaded replicas on batch / replicas")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: layerforge's gemm_precision BF16 against PyTorch's bfloat16 autocast")
    parser.add_argument("--interference", action="store_true",
                        help="with --replicas: replica 0 alone against beside the others, layerforge only")
    parser.add_argument("--child", choices=("layerforge", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--net", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    sys.path.insert(0, HERE)
    import bench_train

    if args.interference and args.replicas < 2:
        parser.error("--interference needs --replicas 2 or more")
    print("\n".join(bench_train.machine_report(1 if args.interference else args.threads)[1]))
    for net in args.nets.split(","):
        if args.interference:
            interference(net, args.iterations, args.replicas, args.precision)
            continue
        lf = measure("layerforge", net, args.iterations, args.threads, args.replicas, args.precision)
        pt = measure("torch", net, args.iterations, args.threads, precision=args.precision)
        how = f"one of {args.replicas} single-threaded replicas" if args.replicas > 1 else f"{args.threads} threads"
        print(f"\n{net}, {args.precision}, layerforge {how}, torch {args.threads} threads, ms per iteration "
              f"(load {os.getloadavg()[0]:.2f})\n")
        print("| kind | layerforge fwd | layerforge bwd | torch fwd | torch bwd | layerforge - torch |")
        print("|---|---:|---:|---:|---:|---:|")
        sums = [0.0] * 4
        for kind in KINDS:
            a, b = lf["kinds"].get(kind, [0.0, 0.0]), pt["kinds"].get(kind, [0.0, 0.0])
            if not any(a + b):
                continue
            sums = [s + v for s, v in zip(sums, a + b)]
            print(f"| {kind} | {a[0]:.1f} | {a[1]:.1f} | {b[0]:.1f} | {b[1]:.1f} | {a[0] + a[1] - b[0] - b[1]:+.1f} |")
        print(f"| total | {sums[0]:.1f} | {sums[1]:.1f} | {sums[2]:.1f} | {sums[3]:.1f} "
              f"| {sums[0] + sums[1] - sums[2] - sums[3]:+.1f} |")


def interference(net, iterations, replicas, precision):
    """Print replica 0's layers alone (the mean of a run before and one after) against beside the other replicas."""
    alone = [measure("layerforge", net, iterations, 1, replicas, precision, processes=1)]
    together = measure("layerforge", net, iterations, 1, replicas, precision)
    alone.append(measure("layerforge", net, iterations, 1, replicas, precision, processes=1))
    rows = collections.defaultdict(lambda: [0.0] * 4)  # kind: alone fwd, bwd, together fwd, bwd
    losses, other_engines = [], [row[0] for run in alone for row, beside in zip(run["layers"], together["layers"])
                                 if row[1] != beside[1]]
    for first, second, beside in zip(alone[0]["layers"], alone[1]["layers"], together["layers"]):
        mean = [(first[2] + second[2]) / 2, (first[3] + second[3]) / 2]
        row = rows[beside[1]]
        for i, v in enumerate(mean + beside[2:]):
            row[i] += v
        losses.append((beside[2] + beside[3] - sum(mean), beside[0], beside[1]))
    print(f"\n{net}, {precision}, replica 0 of {replicas} (one thread, batch / {replicas}): alone (mean of 2 runs) and "
          f"beside the others, ms per iteration (load {os.getloadavg()[0]:.2f})\n")
    print("| kind | alone fwd | alone bwd | together fwd | together bwd | together - alone | % |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    sums = [0.0] * 4
    for kind, v in sorted(rows.items(), key=lambda kv: -sum(kv[1][:2])):
        sums = [s + x for s, x in zip(sums, v)]
        loss = v[2] + v[3] - v[0] - v[1]
        print(f"| {kind} | {v[0]:.1f} | {v[1]:.1f} | {v[2]:.1f} | {v[3]:.1f} | {loss:+.1f} | "
              f"{100 * loss / max(v[0] + v[1], 1e-9):+.0f} |")
    loss = sums[2] + sums[3] - sums[0] - sums[1]
    print(f"| layers | {sums[0]:.1f} | {sums[1]:.1f} | {sums[2]:.1f} | {sums[3]:.1f} | {loss:+.1f} | "
          f"{100 * loss / max(sums[0] + sums[1], 1e-9):+.0f} |")
    print(f"\nwhole passes after them (forward + backward): alone {alone[0]['whole_ms']:.1f} and "
          f"{alone[1]['whole_ms']:.1f}, together {together['whole_ms']:.1f}")
    print("the layers that lose the most: " + ", ".join(
        f"{name} ({kind}) {loss:+.1f}" for loss, name, kind in sorted(losses, reverse=True)[:5]))
    if other_engines:  # AUTO chose otherwise in a run (an engine cache filled by this very run, or timing noise)
        print("engines not the same alone and together (rows by the latter's): "
              + ", ".join(sorted(set(other_engines))))


if __name__ == "__main__":
    main()
