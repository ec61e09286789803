"""Check `layerforge plan` against real `mpiexec -n P layerforge train` runs on this machine.

For P in 2, 4: time the solver's net alone (`layerforge time --json`), calibrate alpha/beta/gamma for P ranks
(`mpiexec -n P layerforge bench_allreduce`, which caches them), run P-rank training for a fixed number of
iterations and compare its measured seconds per iteration with the plan's prediction for each algorithm.

    python benchmarks/check_plan.py [--solver configs/lenet_solver.yaml] [--iterations 60]

On a machine with fewer cores than ranks, P processes share the cores, so the compute part of an
iteration grows with P: the script therefore times the net with P concurrent copies (under mpiexec, so
each gets the same thread share as a training rank) and gives the plan that figure.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(args, **kw):
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, **kw)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{proc.stderr[-2000:]}")
    return proc.stdout


def mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solver", default="configs/lenet_solver.yaml")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--ranks", default="2,4")
    args = parser.parse_args()
    py = sys.executable
    cache = tempfile.mkdtemp()
    env = dict(os.environ, LAYERFORGE_COMM_CALIBRATION=os.path.join(cache, "calibration.json"))
    import yaml
    solver = yaml.safe_load(open(os.path.join(ROOT, args.solver)))
    net = os.path.join(ROOT, os.path.dirname(args.solver), solver["net"])
    # log every 10 iterations, no testing or snapshots: the log then gives the iteration rate
    solver.update(net=net, display=10, test_interval=0, test_iter=[], snapshot=0, snapshot_after_train=False)
    args.solver = os.path.join(cache, "solver.yaml")
    with open(args.solver, "w") as f:
        yaml.safe_dump(solver, f)
    print(f"machine: {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}")
    print(f"{'P':>2s} {'algorithm':10s} {'predicted s/iter':>17s} {'measured s/iter':>16s} {'measured/predicted':>19s}")
    for p in [int(x) for x in args.ranks.split(",")]:
        sh([mpiexec(), "-n", str(p), py, "-m", "layerforge", "bench_allreduce", "--sizes", "1M",
            "--algorithms", "auto", "--iterations", "3"], env=env)
        # compute under the same sharing of the cores: P concurrent copies of `layerforge time`
        timing = os.path.join(cache, f"timing{p}.json")
        out = sh([mpiexec(), "-n", str(p), py, "-m", "layerforge", "time", "--model", net, "--iterations", "10",
                  "--json"], env=env)
        runs, decoder, pos = [], json.JSONDecoder(), 0
        while pos < len(out.strip()):
            obj, pos = decoder.raw_decode(out, pos)
            runs.append(obj)
            while pos < len(out) and out[pos].isspace():
                pos += 1
        with open(timing, "w") as f:
            json.dump(max(runs, key=lambda r: r["forward_backward_ms"]), f)
        plan = json.loads(sh([py, "-m", "layerforge", "plan", "--solver", args.solver, "--nodes", str(p),
                              "--timing", timing, "--json"], env=env))
        print(f"P={p}: compute {plan['compute_ms']:.1f} ms per rank (slowest of {p} concurrent copies), "
              f"gradients {plan['gradient_bytes'] / 2**20:.2f} MiB")
        for row in plan["rows"]:
            if row["algorithm"] not in ("recursive", "ring", "mpi"):
                continue
            out = sh([mpiexec(), "-n", str(p), py, "-m", "layerforge", "train", "--solver", args.solver,
                      "--max-iter", str(args.iterations), "--allreduce", row["algorithm"]], env=env)
            rates = [float(m) for m in re.findall(r"\(([\d.]+) iter/s", out)][1:]
            measured = 1.0 / (sum(rates) / len(rates)) if rates else float("nan")
            predicted = row["iteration_ms"] / 1000.0
            print(f"{p:2d} {row['algorithm']:10s} {predicted:17.4f} {measured:16.4f} {measured / predicted:19.2f}")


if __name__ == "__main__":
    main()
