"""``layerforge time --model NET.yaml``: per-layer forward/backward timing, like ``caffe time``.

Per-layer figures come from passes with a timer around every layer; the forward / backward totals come
from separate passes timed as a whole, so they do not include the per-layer timers' own overhead.
"""
import json
import time

from ..net import Net
from ..netdef import load_net_def, set_batch_size
from .summary import format_shape

HELP = "time each layer's forward and backward passes and print a table with totals"


def add_arguments(parser):
    parser.add_argument("--model", required=True, help="net YAML file")
    parser.add_argument("--iterations", type=int, default=20, help="timed iterations (after one warm-up)")
    parser.add_argument("--batch", type=int, default=None, help="override the batch size of input/data layers")
    parser.add_argument("--phase", choices=("train", "test"), default="train")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")


def time_net(net, iterations):
    """Time ``net``; returns a dict with per-layer rows and totals (milliseconds per iteration)."""
    n = len(net.layers)
    fwd, bwd = [0.0] * n, [0.0] * n
    net.forward()
    net.backward()
    clock = time.perf_counter
    for _ in range(iterations):
        for i in range(n):
            t0 = clock()
            net.forward_layer(i)
            fwd[i] += clock() - t0
        for i in reversed(range(n)):
            t0 = clock()
            net.backward_layer(i)
            bwd[i] += clock() - t0
    total_fwd = total_bwd = 0.0
    for _ in range(iterations):
        t0 = clock()
        net.forward()
        t1 = clock()
        net.backward()
        t2 = clock()
        total_fwd += t1 - t0
        total_bwd += t2 - t1
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
        })
    return {"net": net.name, "iterations": iterations, "layers": rows,
            "forward_ms": total_fwd * ms, "backward_ms": total_bwd * ms,
            "forward_backward_ms": (total_fwd + total_bwd) * ms}


def run(args):
    netdef = load_net_def(args.model)
    if args.batch is not None:
        set_batch_size(netdef, args.batch)
    net = Net(netdef, phase=args.phase)
    result = time_net(net, args.iterations)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    header = ("layer", "type", "top shape", "forward ms", "backward ms", "share", "fwd GFLOP/s", "bwd GFLOP/s")
    table = [(r["layer"], r["type"], " ".join(format_shape(s) for s in r["top_shape"]),
              f"{r['forward_ms']:.3f}", f"{r['backward_ms']:.3f}", f"{100 * r['share']:.1f}%",
              f"{r['forward_gflops']:.2f}" if r["forward_gflops"] else "-",
              f"{r['backward_gflops']:.2f}" if r["backward_gflops"] else "-") for r in result["layers"]]
    widths = [max(len(row[k]) for row in table + [header]) for k in range(len(header))]
    fmt = "  ".join(f"{{:{'<' if k < 3 else '>'}{w}}}" for k, w in enumerate(widths))
    print(f"Timing net '{net.name}' ({args.phase}), {args.iterations} iterations after 1 warm-up")
    print(fmt.format(*header))
    print("  ".join("-" * w for w in widths))
    for row in table:
        print(fmt.format(*row))
    print(f"Average Forward pass: {result['forward_ms']:.3f} ms.")
    print(f"Average Backward pass: {result['backward_ms']:.3f} ms.")
    print(f"Average Forward-Backward: {result['forward_backward_ms']:.3f} ms.")
    return 0
