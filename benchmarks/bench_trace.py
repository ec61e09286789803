"""What tracing costs: per span, off and on, beside PyTorch's profiler; and on a LeNet training iteration.

    python benchmarks/bench_trace.py [--calls 200000] [--iterations 20] [--rounds 3] [--trace lenet.json]
                                     [--picture lenet.png]

Per-span figures are microseconds per ``with`` block (an empty loop's time subtracted), best of 5 runs of
``--calls`` calls:

- layerforge, tracing off: ``trace.span`` (returns the shared null span), ``trace.layer``, ``trace.iteration``;
  ``trace.wait`` (always measures: the TensorBoard figures need it).
- layerforge, tracing on (in the window): ``trace.span`` with one argument, ``trace.layer`` on LeNet's conv2
  (type, shapes, bytes, FLOPs), ``trace.complete``.
- PyTorch 2.13 (the peer): ``torch.profiler.record_function`` with no profiler running, and inside
  ``torch.profiler.profile()`` (CPU activities).

Then LeNet (bench_train.py's: batch 64, the SGD solver) trains ``--iterations`` iterations three ways, the
rounds alternating so that other work on the machine hits all three alike: plain (the net's own loops, no trace
calls), with a ``trace.layer`` span around every layer's forward and backward and one around the update but
tracing off, and with tracing on. The median iteration of each is printed, with the projected cost of tracing
on (spans per iteration x the per-span cost, over the plain iteration). ``--trace``/``--picture`` write the
traced iterations and a picture of one.
"""
import argparse
import contextlib
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)


def per_call_us(body, calls, repeats=5):
    """Best of ``repeats`` runs: microseconds per call of ``body(calls)`` less an empty loop's."""
    def run(fn):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(calls)
            best = min(best, time.perf_counter() - t0)
        return best / calls * 1e6

    def empty(n):
        for _ in range(n):
            pass
    return max(0.0, run(body) - run(empty))


def span_costs(calls, conv):
    from layerforge import trace

    net, i = conv

    def span(n):
        for _ in range(n):
            with trace.span("forward", "conv1"):
                pass

    def span_arg(n):
        for _ in range(n):
            with trace.span("comm", "bucket 0", bytes=4096):
                pass

    def layer(n):
        layer_obj, bottom, top = net.layers[i], net.bottom_blobs(i), net.top_blobs(i)
        for _ in range(n):
            with trace.layer("forward", layer_obj, bottom, top):
                pass

    def iteration(n):
        for k in range(n):
            trace.iteration(k)

    def wait(n):
        for _ in range(n):
            with trace.wait("data"):
                pass

    def complete(n):
        t0 = trace.clock()
        for _ in range(n):
            trace.complete("comm", "bucket 0", t0, 1e-4, {"bytes": 4096}, thread="comm")

    out = {"off": {"span": per_call_us(span, calls), "layer": per_call_us(layer, calls),
                   "iteration": per_call_us(iteration, calls), "wait": per_call_us(wait, calls)}}
    trace.start(None, iterations=None)
    out["on"] = {"span": per_call_us(span_arg, calls), "layer": per_call_us(layer, calls),
                 "complete": per_call_us(complete, calls)}
    trace.stop()
    return out


def torch_costs(calls):
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    def body(n):
        for _ in range(n):
            with record_function("conv1"):
                pass
    off = per_call_us(body, calls)
    with profile(activities=[ProfilerActivity.CPU]):
        on = per_call_us(body, min(calls, 50000), repeats=3)  # the profiler keeps every event in memory
    return {"off": off, "on": on, "version": torch.__version__}


def lenet_iterations(iterations, rounds, trace_path, picture):
    import bench_train
    from layerforge import trace
    from layerforge.kernels.autotune import engines_settled

    solver = bench_train.layerforge_solver("lenet")
    net = solver.net
    n = len(net.layers)

    def plain():
        net.clear_param_diffs()
        net.forward()
        net.backward()
        solver.apply_update()

    def spanned():
        net.clear_param_diffs()
        for i in range(n):
            with trace.layer("forward", net.layers[i], net.bottom_blobs(i), net.top_blobs(i)):
                net.forward_layer(i)
        for i in reversed(range(n)):
            with trace.layer("backward", net.layers[i], net.bottom_blobs(i), net.top_blobs(i)):
                net.backward_layer(i)
        with trace.span("update", "SGD"):
            solver.apply_update()

    warm = 0
    while warm < 3 or (warm < 30 and not engines_settled(net)):
        plain()
        warm += 1
    times = {"plain": [], "off": [], "on": []}
    k = 0
    for _ in range(rounds):
        for mode in times:
            if mode == "on":
                trace.start(None, iterations=None)
            for _ in range(iterations):
                t0 = time.perf_counter()
                trace.iteration(k)
                (plain if mode == "plain" else spanned)()
                times[mode].append(time.perf_counter() - t0)
                k += 1
            if mode == "on":
                part = trace.stop()
    spans = 2 * n + 2  # a forward and a backward per layer, the update, the iteration
    if trace_path:
        last = [e for e in part["events"] if e[5] is not None and e[5] >= k - 3]  # the last three iterations
        trace.write_trace(trace_path, [dict(part, events=last)])
        if picture:
            trace.plot_iteration(trace.load_trace(trace_path), picture, k - 2, path=trace_path)
    return {mode: statistics.median(t) * 1e3 for mode, t in times.items()}, spans, warm, n


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200000, help="calls per per-span measurement")
    parser.add_argument("--iterations", type=int, default=20, help="LeNet iterations per mode per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trace", metavar="FILE.json", help="write the traced LeNet iterations here")
    parser.add_argument("--picture", metavar="FILE.png", help="and a picture of one (needs --trace)")
    args = parser.parse_args()

    import bench_train

    import layerforge

    conv_solver = bench_train.layerforge_solver("lenet")
    conv = (conv_solver.net, [layer.name for layer in conv_solver.net.layers].index("conv2"))
    costs = span_costs(args.calls, conv)
    peer = torch_costs(args.calls)
    print(f"layerforge {layerforge.__version__}, PyTorch {peer['version']}; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("per span, microseconds (empty loop subtracted; best of 5)")
    print(f"{'':44}{'layerforge':>12}{'PyTorch':>12}")
    rows = [("off: span / record_function, no profiler", costs["off"]["span"], peer["off"]),
            ("off: layer span (LeNet conv2)", costs["off"]["layer"], None),
            ("off: iteration mark", costs["off"]["iteration"], None),
            ("wait (always measured)", costs["off"]["wait"], None),
            ("on: span / record_function in a profile", costs["on"]["span"], peer["on"]),
            ("on: layer span (type, shapes, bytes, FLOPs)", costs["on"]["layer"], None),
            ("on: complete (measured elsewhere)", costs["on"]["complete"], None)]
    for label, ours, theirs in rows:
        print(f"{label:44}{ours:>12.3f}{'' if theirs is None else f'{theirs:.3f}':>12}")
    medians, spans, warm, n = lenet_iterations(args.iterations, args.rounds, args.trace, args.picture)
    print()
    print(f"LeNet (batch 64, {n} layers, SGD), median of {args.iterations * args.rounds} iterations per mode "
          f"after {warm} warm-up, ms")
    for mode, label in (("plain", "plain (no trace calls)"), ("off", "spans, tracing off"),
                        ("on", "spans, tracing on")):
        extra = "" if mode == "plain" else f"   ({100 * (medians[mode] / medians['plain'] - 1):+.2f}% measured)"
        print(f"  {label:26}{medians[mode]:9.3f}{extra}")
    # per iteration: 2n layer spans, the update's span and the iteration mark (on: it records a span too)
    projected_off = 2 * n * costs["off"]["layer"] + costs["off"]["span"] + costs["off"]["iteration"]
    projected_on = 2 * n * costs["on"]["layer"] + 2 * costs["on"]["span"]
    print(f"  projected from the per-span figures ({spans} spans per iteration): off "
          f"{projected_off:.1f} us = {projected_off / 10 / medians['plain']:.3f}%, on "
          f"{projected_on:.1f} us = {projected_on / 10 / medians['plain']:.2f}% of the plain iteration")
    if args.trace:
        print(f"wrote {args.trace}" + (f" and {args.picture}" if args.picture else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
