"""Scale-out on the multi-host test bed (layerforge/comm/testbed.py): allreduce busbw per algorithm with the
bytes each host's link really carried, the cost model's predictions beside them, and data-parallel training
iterations (LeNet, small-batch AlexNet) with the exchange after backward, overlapped, and double-buffered. Needs root or CAP_NET_ADMIN.

    python benchmarks/bench_scaleout.py [--out DIR] [--rates 1,10] [--layouts 2x1,2x2,4x1,4x2]
                                        [--sizes 1M,10M,100M] [--nets lenet,alexnet] [--skip-allreduce]
    python benchmarks/bench_scaleout.py --report DIR/results.json    # the tables of docs/distributed.md

Each table is printed as Markdown with the machine's load average when it was measured. JSON per run goes
to --out. The allreduce part reuses `layerforge bench_allreduce` under `mpiexec` across the bed, one run per
algorithm so the switch-port counters can be attributed to it; the training part runs `layerforge train`,
`layerforge time` (the compute of p concurrent ranks) and `layerforge plan` under the same bed.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from layerforge.commands.bench_allreduce import parse_size  # noqa: E402
from layerforge.comm.cost_model import CostParams, predict  # noqa: E402
from layerforge.comm.testbed import TestBed, link_delta, unavailable_reason  # noqa: E402

ALGORITHMS = ("recursive", "topology", "ring", "hierarchical", "mpi")
NETS = {"lenet": ("configs/lenet_solver.yaml", 200, 20), "alexnet": ("configs/alexnet.yaml", 8, 2)}
PY = sys.executable
# one BLAS thread per rank: 2 ranks on 2 cores then compute as 1 rank does, so efficiency measures communication
ENV = {"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def load():
    return f"load {os.getloadavg()[0]:.2f}"


def run_ok(bed, argv, hosts, ranks_per_host, env=None, timeout=600):
    done = bed.run(argv, ranks_per_host=ranks_per_host, hosts=hosts, env={**ENV, **(env or {})}, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"failed on {hosts}x{ranks_per_host}: {' '.join(argv)}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def calibrate(bed, hosts, rph, cache):
    """alpha/beta/gamma measured on this layout (cost_model.calibrate through bench_allreduce's `auto`)."""
    run_ok(bed, [PY, "-m", "layerforge", "bench_allreduce", "--sizes", "1K", "--algorithms", "auto",
                 "--iterations", "1"], hosts, rph, env={"LAYERFORGE_COMM_CALIBRATION": cache})
    with open(cache) as f:
        table = json.load(f)
    key = next(k for k in table if f"|p={hosts * rph}|groups={hosts}x{rph}|" in k)
    return CostParams.from_dict(table[key])


def bench_layout(bed, hosts, rph, sizes, iterations, cache):
    """Rows per (size, algorithm): bench_allreduce's figures + link bytes per host + the model's prediction."""
    params = calibrate(bed, hosts, rph, cache)
    p, rows = hosts * rph, []
    for name in ALGORITHMS:
        before = bed.link_bytes()
        out = run_ok(bed, [PY, "-m", "layerforge", "bench_allreduce", "--sizes", ",".join(str(s) for s in sizes),
                           "--algorithms", name, "--iterations", str(iterations), "--warmup", "1", "--json"],
                     hosts, rph)
        delta = link_delta(before, bed.link_bytes())
        doc = json.loads(out[out.index("{"):out.rindex("}") + 1])
        # the counters see every repetition of every size: per message byte, then scaled to each size
        moved = sum(r["bytes"] for r in doc["results"]) * (iterations + 1)
        used = bed.host_names[:hosts]
        per_byte = max(delta[h]["sent"] for h in used) / moved
        for r in doc["results"]:
            r.update(hosts=hosts, ranks_per_host=rph, gbit=bed.gbit[0], link_bytes_per_host=per_byte * r["bytes"],
                     counted_inter_per_host=None if r["inter_bytes"] is None else r["inter_bytes"] * rph,
                     predicted_s=predict(name, r["bytes"], p, rph, params), load=os.getloadavg()[0])
            rows.append(r)
    return params, rows


def mb(x):
    return "-" if x is None else f"{x / 1e6:.1f}"


def print_allreduce(rows, params, hosts, rph, gbit):
    print(f"\n#### {hosts} hosts x {rph} ranks, {gbit:g} Gbit/s per host link ({load()} after the runs)\n")
    print(f"Calibrated on the bed: alpha {params.alpha * 1e6:.0f} us, beta_intra "
          f"{1e-9 / params.beta_intra if params.beta_intra else float('inf'):.2f} GB/s, beta_inter "
          f"{1e-9 / params.beta_inter if params.beta_inter else float('inf'):.3f} GB/s, gamma "
          f"{1e-9 / params.gamma:.2f} GB/s.\n")
    print("| size | algorithm | latency ms | busbw GB/s | vs mpi | counted inter MB/host | link MB/host "
          "| predicted ms | measured/predicted |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    mpi = {r["bytes"]: r["busbw_GBps"] for r in rows if r["algorithm"] == "mpi"}
    for r in sorted(rows, key=lambda r: (r["bytes"], ALGORITHMS.index(r["algorithm"]))):
        ok = "" if r["correct"] else " WRONG"
        print(f"| {r['bytes'] / 2 ** 20:g} MiB | {r['algorithm']}{ok} | {r['latency_s'] * 1e3:.2f} | "
              f"{r['busbw_GBps']:.3f} | {r['busbw_GBps'] / mpi[r['bytes']]:.2f} | {mb(r['counted_inter_per_host'])} | "
              f"{mb(r['link_bytes_per_host'])} | {r['predicted_s'] * 1e3:.2f} | "
              f"{r['latency_s'] / r['predicted_s']:.2f} |")


def print_targets(all_rows):
    """Topology over recursive at the largest size on the slowest links: measured factor vs the byte factor."""
    print("\n#### Targets at the largest size\n")
    print("| layout | Gbit/s | topology/recursive busbw | byte factor (recursive/topology inter MB per host) "
          "| measured/predicted factor | best own / mpi busbw |")
    print("|---|---:|---:|---:|---:|---:|")
    for (hosts, rph, gbit), rows in all_rows.items():
        big = max(r["bytes"] for r in rows)
        at = {r["algorithm"]: r for r in rows if r["bytes"] == big}
        rec, top = at["recursive"], at["topology"]
        measured = top["busbw_GBps"] / rec["busbw_GBps"]
        factor = rec["counted_inter_per_host"] / top["counted_inter_per_host"]
        best = max(at[a]["busbw_GBps"] for a in ("recursive", "topology"))
        print(f"| {hosts}x{rph} | {gbit:g} | {measured:.2f} | {factor:.2f} | {measured / factor:.2f} | "
              f"{best / at['mpi']['busbw_GBps']:.2f} |")


def milliseconds(seconds):
    ms = seconds * 1e3
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def print_report(path):
    """The condensed tables of docs/distributed.md from a results.json this script wrote."""
    with open(path) as f:
        results = json.load(f)
    cells = {}
    for r in results["allreduce"]:
        cells.setdefault((r["gbit"], r["hosts"], r["ranks_per_host"], r["bytes"]), {})[r["algorithm"]] = r
    print("| Gbit/s | hosts x ranks | size | " + " | ".join(ALGORITHMS) + " | load |")
    print("|---:|---|---:|" + "---:|" * (len(ALGORITHMS) + 1))
    for (gbit, hosts, rph, nbytes), at in sorted(cells.items()):
        print(f"| {gbit:g} | {hosts}x{rph} | {nbytes / 2 ** 20:g} MiB | " + " | ".join(
            f"{at[a]['busbw_GBps']:.3f} ({milliseconds(at[a]['latency_s'])})" for a in ALGORITHMS) +
            f" | {max(r['load'] for r in at.values()):.1f} |")
    print("\n| Gbit/s | hosts x ranks | " + " | ".join(f"{a} MB | meas/pred" for a in ALGORITHMS) + " |")
    print("|---:|---|" + "---:|---:|" * len(ALGORITHMS))
    largest = max(k[3] for k in cells)
    for (gbit, hosts, rph, nbytes), at in sorted(cells.items()):
        if nbytes == largest:
            print(f"| {gbit:g} | {hosts}x{rph} | " + " | ".join(
                f"{mb(at[a]['counted_inter_per_host']) + ' / ' if at[a]['counted_inter_per_host'] else ''}"
                f"{mb(at[a]['link_bytes_per_host'])} | {at[a]['latency_s'] / at[a]['predicted_s']:.2f}"
                for a in ALGORITHMS) + " |")
    print("\n| Gbit/s | net | hosts x ranks | exchange | s/iter | 1 rank s/iter | compute s | exposed s | exposed % "
          "| efficiency | plan s/iter | measured/plan | load |")
    print("|---:|---|---|---|" + "---:|" * 9)
    for r in results["training"]:
        mode = r.get("mode", "on" if r["overlap"] else "off")
        print(f"| {r['gbit']:g} | {r['net']} | {r['hosts']}x{r['ranks_per_host']} | {mode} "
              f"| {r['s_per_iter']:.3f} | {r['one_rank_s_per_iter']:.3f} | {r['compute_s']:.3f} | {r['exposed_s']:.3f} "
              f"| {100 * r['exposed_s'] / r['s_per_iter']:.0f}% | {100 * r['efficiency']:.0f}% | {r['plan_s']:.3f} "
              f"| {r['s_per_iter'] / r['plan_s']:.2f} | {r['load']:.1f} |")


def solver_copy(solver, workdir, net, **keys):
    """The solver YAML with absolute net path, no testing or snapshots, plus ``keys``; returns its path."""
    import yaml

    with open(os.path.join(ROOT, solver)) as f:
        sp = yaml.safe_load(f)
    sp.update(net=os.path.join(ROOT, os.path.dirname(solver), sp["net"]), test_interval=0, test_iter=[], snapshot=0,
              snapshot_after_train=False, test_initialization=False, **keys)
    path = os.path.join(workdir, f"{net}_{'_'.join(f'{k}{v}' for k, v in keys.items()) or 'plain'}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(sp, f)
    return path, sp["net"]


def seconds_per_iteration(log):
    """Mean seconds per iteration from the solver's display lines, the first (warm-up) left out."""
    rates = [float(m) for m in re.findall(r"Iteration \d+ \(([\d.eE+-]+) iter/s", log)][1:]
    if not rates:
        sys.exit(f"no iteration rates in the training log:\n{log[-2000:]}")
    return len(rates) / sum(rates)


def compute_seconds(bed, net_path, hosts, rph, timing_out):
    """Forward-backward seconds of the slowest of p concurrent `layerforge time` copies (same core sharing)."""
    out = run_ok(bed, [PY, "-m", "layerforge", "time", "--model", net_path, "--iterations", "3", "--json"], hosts, rph)
    decoder, pos, runs = json.JSONDecoder(), 0, []
    while True:
        start = out.find("{", pos)
        if start < 0:
            break
        obj, pos = decoder.raw_decode(out, start)
        runs.append(obj)
    slowest = max(runs, key=lambda r: r["forward_backward_ms"])
    with open(timing_out, "w") as f:
        json.dump(slowest, f)
    return slowest["forward_backward_ms"] / 1e3


# exchange modes: the solver keys of each, and the plan row's prediction for it (commands/plan.py)
MODES = {"off": ({"allreduce_overlap": False}, "iteration_ms"), "on": ({"allreduce_overlap": True}, "overlapped_ms"),
         "double": ({"double_buffering": True}, "double_buffered_ms")}


def bench_training(bed, nets, layouts, workdir, cache, algorithm, modes=("off", "on", "double")):
    print(f"\n#### Training on {bed.gbit[0]:g} Gbit/s links, `--allreduce {algorithm}` ({load()} at start)\n")
    print("| net | layout | exchange | s/iter | 1-rank s/iter | compute s (p concurrent) | exposed comm s "
          "| exposed % | scaling eff. | plan s/iter | measured/plan |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for net in nets:
        solver, iters, display = NETS[net]
        plain, net_path = solver_copy(solver, workdir, net, display=display)
        one = seconds_per_iteration(run_ok(bed, [PY, "-m", "layerforge", "train", "--solver", plain, "--max-iter",
                                                 str(iters), "--allreduce", algorithm], 1, 1))
        for hosts, rph in layouts:
            timing = os.path.join(workdir, f"timing_{net}_{hosts}x{rph}.json")
            compute = compute_seconds(bed, net_path, hosts, rph, timing)
            params = calibrate(bed, hosts, rph, cache)
            plan = json.loads(subprocess.run(
                [PY, "-m", "layerforge", "plan", "--solver", plain, "--nodes", str(hosts * rph), "--group", str(rph),
                 "--timing", timing, "--cost", ",".join(repr(v) for v in params.to_dict().values()), "--json"],
                capture_output=True, text=True, check=True, cwd=ROOT).stdout)
            plan_row = next(r for r in plan["rows"] if r["algorithm"] == algorithm)
            for mode in modes:
                keys, plan_key = MODES[mode]
                planned = plan_row[plan_key] / 1e3
                path, _ = solver_copy(solver, workdir, net, display=display, **keys)
                it = seconds_per_iteration(run_ok(bed, [PY, "-m", "layerforge", "train", "--solver", path,
                                                        "--max-iter", str(iters), "--allreduce", algorithm],
                                                  hosts, rph))
                exposed = max(it - compute, 0.0)
                row = {"net": net, "hosts": hosts, "ranks_per_host": rph, "gbit": bed.gbit[0], "mode": mode,
                       "overlap": mode == "on", "s_per_iter": it, "one_rank_s_per_iter": one, "compute_s": compute,
                       "exposed_s": exposed, "efficiency": one / it, "plan_s": planned,
                       "gradient_bytes": plan["gradient_bytes"], "load": os.getloadavg()[0]}
                rows.append(row)
                print(f"| {net} | {hosts}x{rph} | {mode} | {it:.3f} | {one:.3f} | "
                      f"{compute:.3f} | {exposed:.3f} | {100 * exposed / it:.0f}% | {100 * one / it:.0f}% | "
                      f"{planned:.3f} | {it / planned:.2f} |", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="directory for the JSON results (default: a new temp dir)")
    parser.add_argument("--rates", default="1,10", help="link rates in Gbit/s, one bed each")
    parser.add_argument("--layouts", default="2x1,2x2,4x1,4x2", help="hosts x ranks per host for the allreduce")
    parser.add_argument("--sizes", default="1M,10M,100M")
    parser.add_argument("--iterations", type=int, default=3, help="timed allreduces per size (after one warm-up)")
    parser.add_argument("--nets", default="lenet,alexnet", help="nets to train ('' for none)")
    parser.add_argument("--train-layouts", default="2x1", help="hosts x ranks per host for training")
    parser.add_argument("--train-allreduce", default="topology")
    parser.add_argument("--modes", default="off,on,double", help="exchange modes to train with: off (after "
                        "backward), on (allreduce_overlap), double (double_buffering)")
    parser.add_argument("--skip-allreduce", action="store_true")
    parser.add_argument("--prefix", default="lfbench", help="the bed's name prefix")
    parser.add_argument("--report", metavar="RESULTS_JSON", help="only print the docs' tables from an earlier run")
    args = parser.parse_args()
    if args.report:
        return print_report(args.report)
    reason = unavailable_reason()
    if reason:
        sys.exit(f"bench_scaleout: {reason}")
    os.chdir(ROOT)  # the ranks' working directory: the configs' relative data paths start here
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="scaleout-"))
    os.makedirs(out, exist_ok=True)
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    def layouts(text):
        return [tuple(int(v) for v in spec.split("x")) for spec in text.split(",") if spec]

    nets = [n for n in args.nets.split(",") if n]
    hosts_needed = max(h for h, _ in layouts(args.layouts) + layouts(args.train_layouts))
    print(f"# bench_scaleout: {os.cpu_count()} cores, {load()}; JSON in {out}")
    results = {"allreduce": [], "training": []}
    for gbit in [float(r) for r in args.rates.split(",")]:
        with TestBed(hosts_needed, gbit=gbit, prefix=args.prefix) as bed:
            print(f"\n### {bed.describe()}")
            cache = os.path.join(out, f"calibration_{gbit:g}.json")
            if not args.skip_allreduce:
                by_layout = {}
                for hosts, rph in layouts(args.layouts):
                    params, rows = bench_layout(bed, hosts, rph, sizes, args.iterations, cache)
                    print_allreduce(rows, params, hosts, rph, gbit)
                    by_layout[(hosts, rph, gbit)] = rows
                    results["allreduce"] += rows
                    sys.stdout.flush()
                print_targets(by_layout)
            if nets:
                results["training"] += bench_training(bed, nets, layouts(args.train_layouts), out, cache,
                                                      args.train_allreduce, args.modes.split(","))
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
