"""Winograd F(4,3) and F(2,3) with compiled CPU transforms against IM2COL on ResNet-50's 3x3 convolutions.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_winograd.py [--rounds 5] \
        [--threads 1,2] [--batches 8,4] [--error]

For each 3x3 stride-1 shape of ResNet-50 (64 channels at 56 x 56, 128 at 28, 256 at 14, 512 at 7), batch and
thread count (BLAS and the kernel threads alike): forward and backward (data, filter and bias gradients) of
WINOGRAD (F4), WINOGRAD_F2 and IM2COL, float32. The engines alternate within each round (the order rotating
from round to round), so load from other jobs on the machine falls on all three alike; the table gives the
median of ``--rounds`` rounds after one warm-up call each, in milliseconds, and each Winograd engine's time
as a fraction of IM2COL's (below 1: faster). The load average is printed before and after.

``--error`` adds each engine's float32 error against a float64 direct convolution on the same data (unit
normal input and output gradient, He-initialised weights): max |a - a_float64| / max |a_float64| of y, gx
and gW, the figures docs/performance.md's Winograd table gives.
"""
import argparse
import os
import statistics
import sys
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_train  # noqa: E402
from layerforge.kernels import threadpool  # noqa: E402
from layerforge.kernels.implicit_gemm import ENGINES  # noqa: E402

SHAPES = [(64, 56), (128, 28), (256, 14), (512, 7)]  # ResNet-50's 3x3 layers: channels in = out, size
NAMES = ("WINOGRAD", "WINOGRAD_F2", "IM2COL")
GEOMETRY = (3, 3, 1, 1, 1, 1, 1, 1)


def problem(c, s, batch, dtype, seed=0):
    """(x, W, b, gy) of one layer: unit normal data and output gradient, He-initialised weights."""
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal((batch, c, s, s))
    W = rng.standard_normal((c, c, 3, 3)) * numpy.sqrt(2.0 / (9 * c))
    b = rng.standard_normal(c) * 0.1
    gy = rng.standard_normal((batch, c, s, s))
    return tuple(a.astype(dtype) for a in (x, W, b, gy))


def run(engine, x, W, b, gy):
    y, gW, gb, gx = numpy.empty(gy.shape, x.dtype), numpy.zeros_like(W), numpy.zeros_like(b), numpy.empty_like(x)
    engine.forward(x, W, b, y)
    engine.backward(x, W, gy, gW, gb, gx)
    return y, gx, gW


def errors(c, s, batch):
    """Each engine's float32 (y, gx, gW) error against IM2COL in float64."""
    exact = run(ENGINES["IM2COL"](GEOMETRY, 1), *problem(c, s, batch, numpy.float64))
    out = {}
    for name in NAMES:
        got = run(ENGINES[name](GEOMETRY, 1), *problem(c, s, batch, numpy.float32))
        out[name] = [float(numpy.abs(a - e).max() / numpy.abs(e).max()) for a, e in zip(got, exact)]
    return out


def timings(c, s, batch, rounds):
    """{engine: (forward ms, backward ms) medians}, the engines alternating within each round."""
    x, W, b, gy = problem(c, s, batch, numpy.float32)
    y, gW, gb, gx = numpy.empty(gy.shape, x.dtype), numpy.zeros_like(W), numpy.zeros_like(b), numpy.empty_like(x)
    engines = {name: ENGINES[name](GEOMETRY, 1) for name in NAMES}
    times = {name: ([], []) for name in NAMES}
    for r in range(rounds + 1):
        for name in NAMES[r % len(NAMES):] + NAMES[:r % len(NAMES)]:
            e = engines[name]
            t0 = time.perf_counter()
            e.forward(x, W, b, y)
            t1 = time.perf_counter()
            e.backward(x, W, gy, gW, gb, gx)
            t2 = time.perf_counter()
            if r:  # round 0 warms up (compilation, first touch of the workspaces)
                times[name][0].append(1000 * (t1 - t0))
                times[name][1].append(1000 * (t2 - t1))
    return {name: (statistics.median(f), statistics.median(bw)) for name, (f, bw) in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--batches", default="8,4")
    parser.add_argument("--error", action="store_true", help="also the float32 error against float64 (batch 2)")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    print("\n".join(bench_train.machine_report(1)[1]))
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; rounds {args.rounds}")
    print("| layer | batch | threads | IM2COL fwd / bwd ms | WINOGRAD_F2 fwd / bwd ms | WINOGRAD (F4) fwd / bwd ms "
          "| F2 / IM2COL fwd, bwd | F4 / IM2COL fwd, bwd | F4 / F2 fwd, bwd |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for threads in map(int, args.threads.split(",")):
        threadpool.set_num_threads(threads)
        with threadpool_limits(threads, "blas"):
            for batch in map(int, args.batches.split(",")):
                for c, s in SHAPES:
                    t = timings(c, s, batch, args.rounds)
                    i, f2, f4 = t["IM2COL"], t["WINOGRAD_F2"], t["WINOGRAD"]
                    print(f"| {c} x {s} -> {c} | {batch} | {threads} | {i[0]:.1f} / {i[1]:.1f} "
                          f"| {f2[0]:.1f} / {f2[1]:.1f} | {f4[0]:.1f} / {f4[1]:.1f} "
                          f"| {f2[0] / i[0]:.2f}, {f2[1] / i[1]:.2f} | {f4[0] / i[0]:.2f}, {f4[1] / i[1]:.2f} "
                          f"| {f4[0] / f2[0]:.2f}, {f4[1] / f2[1]:.2f} |", flush=True)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if args.error:
        print("\nfloat32 error, max |a - a_float64| / max |a_float64| (y, gx, gW), batch 2, pad 1:")
        print("| layer | IM2COL y / gx / gW | WINOGRAD_F2 y / gx / gW | WINOGRAD (F4) y / gx / gW | F4 / IM2COL y |")
        print("|---|---:|---:|---:|---:|")
        for c, s in SHAPES:
            e = errors(c, s, 2)
            cells = [" / ".join(f"{v:.1e}" for v in e[name]) for name in ("IM2COL", "WINOGRAD_F2", "WINOGRAD")]
            print(f"| {c} x {s} -> {c} | {' | '.join(cells)} | {e['WINOGRAD'][0] / e['IM2COL'][0]:.0f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
