"""CGDP benchmark: host vs tree synchronisation for AlexNet and VGG-16 with G workers on this machine.

    python benchmarks/bench_cgdp.py [--nets alexnet,vgg16] [--workers 2] [--iterations 3] [--batch b] [--json out.json]

For each net both modes run in the same invocation with the same per-worker batch (synthetic SyntheticData
from configs/<net>_net.yaml), alternating ``--repeats`` times; each mode's fastest run is kept. Reported per mode: the phases of worker 0 (forward, backward, exposed
exchange, update, iteration; ms), the exposed exchange as % of backward, and the ratio of iteration times
tree / host. The cost model (layerforge/dataparallel/cgdp/cost_model.py) takes the host run's per-layer backward
times, each mode's forward/backward/update totals and the exchange rates worker 0 timed after the host
run (seconds per value copied, added, scaled), and predicts both modes' iteration times, which are
compared with the measurements.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BATCH = {"alexnet": 4, "vgg16": 1}


def run_net(name, G, iterations, chunk_size, repeats=2, batch=None):
    from layerforge.dataparallel.cgdp import train_parallel
    from layerforge.dataparallel.cgdp.cost_model import from_stats

    solver = {"net": os.path.join(ROOT, "configs", f"{name}_net.yaml"), "base_lr": 0.001, "momentum": 0.9,
              "max_iter": iterations + 1, "snapshot_after_train": False, "random_seed": 1}
    batch = batch or BATCH[name]
    runs = {}
    for _ in range(repeats):  # alternate the modes; keep each one's fastest run (the machine is shared)
        for sync in ("host", "tree"):
            r = train_parallel(solver, workers=G, sync=sync, chunk_size=chunk_size, iterations=iterations + 1,
                               batch=batch, log=False)
            if sync not in runs or r.stats["phases_ms"]["iteration"] < runs[sync]["phases_ms"]["iteration"]:
                runs[sync] = r.stats
    host, tree = runs["host"]["phases_ms"], runs["tree"]["phases_ms"]
    model = from_stats(runs["host"])
    # the exchange costs come from the host run; each mode's compute phases from its own run (worker 0)
    predicted = dict(model.predict(G, chunk_size), tree=from_stats(runs["host"], tree).tree(G))
    row = {
        "net": name, "G": G, "batch_per_worker": batch, "chunk_size": chunk_size,
        "host": host, "tree": tree,
        "host_exposed_pct": 100.0 * host["exchange"] / host["backward"],
        "tree_exposed_pct": 100.0 * tree["exchange"] / tree["backward"],
        "iteration_ratio_tree_over_host": tree["iteration"] / host["iteration"],
        "predicted_host_ms": 1000.0 * predicted["host"], "predicted_tree_ms": 1000.0 * predicted["tree"],
        "prediction_error_host_pct": 100.0 * (1000.0 * predicted["host"] / host["iteration"] - 1.0),
        "prediction_error_tree_pct": 100.0 * (1000.0 * predicted["tree"] / tree["iteration"] - 1.0),
        "predicted": {G2: model.predict(G2, chunk_size) for G2 in (2, 4, 8)},
        "chunks_ms": runs["host"]["chunks_ms"], "units": runs["host"]["units"], "rates": runs["host"]["rates"],
    }
    return row


def print_row(r):
    print(f"== {r['net']}: G = {r['G']}, batch {r['batch_per_worker']} per worker, chunk_size {r['chunk_size']}")
    print("mode  forward ms  backward ms  exposed exchange ms  (% of bwd)  update ms  iteration ms  predicted ms")
    for mode in ("host", "tree"):
        p = r[mode]
        pred = r[f"predicted_{mode}_ms"]
        print(f"{mode:<5} {p['forward']:10.1f}  {p['backward']:11.1f}  {p['exchange']:19.1f}  "
              f"{r[f'{mode}_exposed_pct']:9.1f}%  {p['update']:9.1f}  {p['iteration']:12.1f}  {pred:12.1f}")
    print(f"iteration time tree / host: {r['iteration_ratio_tree_over_host']:.3f}; prediction error host "
          f"{r['prediction_error_host_pct']:+.1f}%, tree {r['prediction_error_tree_pct']:+.1f}%")
    for G, p in r["predicted"].items():
        print(f"  predicted G={G}: host {1000 * p['host']:.1f} ms, tree {1000 * p['tree']:.1f} ms, T'/T "
              f"{p['ratio']:.3f}, speed-up host {p['speedup_host']:.2f}, tree {p['speedup_tree']:.2f}")
    print("per chunk (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in r["chunks_ms"].items()))
    print("rates (ns per value): " + ", ".join(f"{k} {1e9 * v:.3f}" for k, v in r["rates"].items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="alexnet,vgg16")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations per mode (after 1 warm-up)")
    parser.add_argument("--chunk-size", type=int, default=1)
    parser.add_argument("--batch", type=int, help="per-worker batch size (default: 4 for AlexNet, 1 for VGG-16)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, alternating; the fastest is kept")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for name in args.nets.split(","):
        load = os.getloadavg()[0]
        rows.append(run_net(name, args.workers, args.iterations, args.chunk_size, args.repeats, args.batch))
        rows[-1]["load_average"] = (load, os.getloadavg()[0])
        print(f"(load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; the machine's 2 cores are shared)")
        print_row(rows[-1])
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
