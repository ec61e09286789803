"""Every distinct convolution shape of ResNet-50 and VGG-16: layerforge's engines and PyTorch, vs SGEMM.

    python benchmarks/bench_conv.py [--batch 2] [--repeat 3] [--threads 2] [--nets resnet50,vgg16]

For each shape: forward and backward (data + filter + bias gradients) GFLOP/s of layerforge's engines
(IM2COL, IMPLICIT, and on 3x3 stride-1 layers WINOGRAD_F2 and WINOGRAD; Winograd's rate counts the
direct convolution's multiply-adds, so it can pass SGEMM's) and of torch.nn.functional.conv2d (same threads, same batch), and the machine's SGEMM rate
for the same GEMM shape (numpy float32 matmul of (M, K) x (K, N) with M = Cout / G,
N = batch out_h out_w, K = Cin / G kh kw), so ``ratio`` = engine rate / SGEMM rate says how close the
convolution comes to the BLAS it is built on. Backward counts 2x the forward multiply-adds (the bias
gradient is not counted). The shapes come from the architectures in bench_train.py. Times are the
minimum of ``--repeat`` runs after one warm-up (the least disturbed figure on a shared machine).
"""
import argparse
import os
import sys
import time

if "--threads" in sys.argv:  # BLAS reads its thread count when numpy loads
    _threads = sys.argv[sys.argv.index("--threads") + 1]
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = _threads

import numpy  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_train import NETS  # noqa: E402
from layerforge.kernels.output_size import conv_output_size  # noqa: E402
from layerforge.kernels import winograd  # noqa: E402
from layerforge.kernels.implicit_gemm import ENGINES  # noqa: E402
from layerforge.kernels.autotune import WINOGRAD_TILES  # noqa: E402


def conv_shapes(net_name):
    """Distinct (cin, size, cout, k, stride, pad, group) of a net's convolutions, with how often each occurs."""
    shape, nodes = NETS[net_name]()
    channels, size = {"data": shape[0]}, {"data": shape[1]}
    seen = {}
    for name, op, bottoms, p in nodes:
        c, s = channels[bottoms[0]], size[bottoms[0]]
        if op == "conv":
            key = (c, s, p["cout"], p["k"], p.get("s", 1), p.get("p", 0), p.get("g", 1))
            seen[key] = seen.get(key, 0) + 1
            c, s = p["cout"], conv_output_size(s, p["k"], p.get("s", 1), p.get("p", 0))
        elif op == "maxpool":
            s = -(-(s - p["k"]) // p["s"]) + 1
        elif op in ("ip", "avepool"):
            c, s = p.get("cout", c), 1
        channels[name], size[name] = c, s
    return seen


def best_time(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_shape(key, batch, repeat):
    import torch
    cin, s, cout, k, stride, pad, group = key
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((batch, cin, s, s), dtype=numpy.float32)
    W = rng.standard_normal((cout, cin // group, k, k), dtype=numpy.float32) * 0.05
    b = numpy.zeros(cout, numpy.float32)
    o = conv_output_size(s, k, stride, pad)
    y = numpy.empty((batch, cout, o, o), numpy.float32)
    gy = rng.standard_normal(y.shape, dtype=numpy.float32)
    gW, gb, gx = numpy.zeros_like(W), numpy.zeros_like(b), numpy.empty_like(x)
    geometry = (k, k, stride, stride, pad, pad, 1, 1)
    flops = 2.0 * batch * cout * o * o * (cin // group) * k * k
    row = {"shape": key, "out": o, "gflop_fwd": flops / 1e9}
    for name, cls in ENGINES.items():
        if name in WINOGRAD_TILES and not winograd.eligible(geometry, WINOGRAD_TILES[name]):
            continue
        engine = cls(geometry, group)
        tf = best_time(lambda: engine.forward(x, W, b, y), repeat)
        tb = best_time(lambda: engine.backward(x, W, gy, gW, gb, gx), repeat)
        row[name] = (flops / tf / 1e9, 2 * flops / tb / 1e9)
        row[name + "_workspace"] = engine.workspace_bytes
        engine.release()
    xt, Wt, bt = torch.tensor(x, requires_grad=True), torch.tensor(W, requires_grad=True), torch.tensor(b, requires_grad=True)
    gyt = torch.tensor(gy)
    conv = torch.nn.functional.conv2d
    with torch.no_grad():
        tf = best_time(lambda: conv(xt, Wt, bt, stride, pad, 1, group), repeat)
    out = conv(xt, Wt, bt, stride, pad, 1, group)
    tb = best_time(lambda: torch.autograd.grad(out, (xt, Wt, bt), gyt, retain_graph=True), repeat)
    row["torch"] = (flops / tf / 1e9, 2 * flops / tb / 1e9)
    M, N, K = cout // group, batch * o * o, (cin // group) * k * k
    A = rng.standard_normal((M, K), dtype=numpy.float32)
    B = rng.standard_normal((K, N), dtype=numpy.float32)
    C = numpy.empty((M, N), numpy.float32)
    tg = best_time(lambda: [numpy.matmul(A, B, out=C) for _ in range(group)], repeat)
    row["sgemm"] = flops / tg / 1e9
    row["gemm"] = (M, N, K)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="resnet50,vgg16")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    print(f"load average before: {os.getloadavg()}; batch {args.batch}, {args.threads} threads")
    print("| net | Cin x H -> Cout, k/s/p/g | GEMM M x N x K | SGEMM GF/s | IM2COL fwd / bwd GF/s | IMPLICIT fwd / bwd "
          "| WINOGRAD_F2 fwd / bwd | WINOGRAD (F4) fwd / bwd | torch fwd / bwd | best lf fwd / bwd vs SGEMM "
          "| best lf / torch fwd, bwd | workspace IM2COL / IMPLICIT MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for net in args.nets.split(","):
        for key, count in conv_shapes(net).items():
            r = bench_shape(key, args.batch, args.repeat)
            cin, s, cout, k, stride, pad, group = key
            engines = [name for name in ENGINES if name in r]
            best_f = max(r[name][0] for name in engines)
            best_b = max(r[name][1] for name in engines)
            wino = [f"{r[n][0]:.0f} / {r[n][1]:.0f}" if n in r else "-" for n in ("WINOGRAD_F2", "WINOGRAD")]
            print(f"| {net} | {cin}x{s} -> {cout}, {k}/{stride}/{pad}/{group} (x{count}) | {'x'.join(map(str, r['gemm']))} "
                  f"| {r['sgemm']:.0f} | {r['IM2COL'][0]:.0f} / {r['IM2COL'][1]:.0f} "
                  f"| {r['IMPLICIT'][0]:.0f} / {r['IMPLICIT'][1]:.0f} | {wino[0]} | {wino[1]} "
                  f"| {r['torch'][0]:.0f} / {r['torch'][1]:.0f} "
                  f"| {best_f / r['sgemm']:.2f} / {best_b / r['sgemm']:.2f} "
                  f"| {best_f / r['torch'][0]:.2f}, {best_b / r['torch'][1]:.2f} "
                  f"| {r['IM2COL_workspace'] / 2**20:.1f} / {r['IMPLICIT_workspace'] / 2**20:.1f} |", flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
