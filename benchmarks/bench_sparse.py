"""Sparse gradient aggregation: bytes sent and time per iteration of dense, allgather, sharded and auto.

    python benchmarks/bench_sparse.py [--ps 2,4] [--vocab 10000,50000] [--dim 512] [--tokens 700]
                                      [--iterations 10] [--group-size 0] [--json out.json]

launches ``mpiexec -n P`` for each P and prints one table per (P, vocabulary): per path the bytes one rank
sends per iteration (mean over ranks, ``comm.bytes_sent``), the aggregation time (median over iterations
of the slowest rank; the paths take turns within each iteration, in a rotating order, so they share the
load), the cost model's prediction (``predict_sparse`` with alpha, beta, gamma calibrated in the same run)
and, for auto, the path it picked.

Each iteration every rank holds the gradient of an embedding table (vocab x dim, float32) for ``--tokens``
token ids (Zaremba et al.'s medium LSTM: 20 sequences x 35 steps = 700), drawn i.i.d. from a Zipf law
p(k) ~ k^-s over the vocabulary with s = 1.06: the least-squares slope of log frequency against log rank
(ranks 10..10,000) of the 588k tokens of the Python standard library's top-level modules, tokenized with
``tokenize`` (natural-language text gives s close to 1 too). Rows are the gradient of Embed: the token
ids' unique rows with summed values. Compare with ``layerforge plan`` for a whole net.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

import numpy

ZIPF_EXPONENT = 1.06
PATHS = ("dense", "allgather", "sharded", "auto")


def zipf_tokens(rng, vocab, n, s=ZIPF_EXPONENT):
    """``n`` token ids in [0, vocab) with p(k) ~ (k + 1)^-s (id 0 the most frequent)."""
    weights = numpy.arange(1, vocab + 1, dtype=numpy.float64) ** -s
    return rng.choice(vocab, size=n, p=weights / weights.sum())


def worker(args):
    from mpi4py import MPI

    from layerforge.blob import SparseGradient
    from layerforge.comm import Communicator, aggregate
    from layerforge.comm.cost_model import choose_sparse, load_or_calibrate, predict_sparse

    comm = Communicator(MPI.COMM_WORLD, group_size=args.group_size or None)
    comm.cost_params = load_or_calibrate(comm)
    results = []
    for vocab in args.vocab:
        rng = numpy.random.default_rng(1000 * vocab + comm.rank)
        grads = []
        for _ in range(args.iterations + 1):  # + 1 warm-up
            tokens = zipf_tokens(rng, vocab, args.tokens)
            rows = rng.standard_normal((args.tokens, args.dim)).astype(numpy.float32)
            grads.append(SparseGradient.coalesce(tokens, rows))
        counts = numpy.empty(comm.size, numpy.int64)
        comm.comm.Allgather(numpy.array([len(grads[0])], numpy.int64), counts)
        union = len(aggregate(comm, grads[0], vocab, "allgather"))
        model = (counts.tolist(), union, args.dim * 4, vocab, comm.group_size, comm.cost_params)
        chosen = choose_sparse(*model)
        times, sent = {path: [] for path in PATHS}, {path: [] for path in PATHS}
        for k, grad in enumerate(grads):
            for path in PATHS[k % len(PATHS):] + PATHS[:k % len(PATHS)]:  # taking turns: the same load for all
                comm.reset_counters()
                comm.comm.Barrier()
                t0 = time.perf_counter()
                aggregate(comm, grad, vocab, chosen if path == "auto" else path)
                dt = comm.comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if k:
                    times[path].append(dt)
                    sent[path].append(comm.comm.allreduce(sum(comm.bytes_sent.values()), op=MPI.SUM) / comm.size)
        for path in PATHS:
            run = chosen if path == "auto" else path
            results.append({"p": comm.size, "vocab": vocab, "dim": args.dim, "tokens": args.tokens,
                            "rows_per_rank": int(counts.max()), "rows_in_sum": union, "path": path, "ran": run,
                            "bytes_per_rank": float(numpy.mean(sent[path])),
                            "ms": 1e3 * float(numpy.median(times[path])),
                            "predicted_ms": 1e3 * predict_sparse(run, *model)})
    if comm.rank == 0:
        print(json.dumps({"results": results, "cost_params": comm.cost_params.to_dict()}))


def print_table(results):
    by = {}
    for r in results:
        by.setdefault((r["p"], r["vocab"]), []).append(r)
    for (p, vocab), rows in by.items():
        r0 = rows[0]
        dense = next(r for r in rows if r["path"] == "dense")
        best = min((r for r in rows if r["path"] != "auto"), key=lambda r: r["ms"])
        print(f"\nP = {p}, vocabulary {vocab}, dim {r0['dim']}, {r0['tokens']} tokens per rank: "
              f"{r0['rows_per_rank']} rows per rank at most, {r0['rows_in_sum']} in the sum")
        print(f"{'path':18s} {'MB sent/rank':>8s} {'vs dense':>9s} {'ms':>9s} {'speed-up':>9s} {'predicted ms':>13s}")
        for r in rows:
            name = f"auto ({r['ran']})" if r["path"] == "auto" else r["path"]
            fewer = dense["bytes_per_rank"] / max(r["bytes_per_rank"], 1)
            print(f"{name:18s} {r['bytes_per_rank'] / 1e6:8.2f} {fewer:8.1f}x "
                  f"{r['ms']:9.2f} {dense['ms'] / r['ms']:8.2f}x {r['predicted_ms']:13.2f}")
        auto = next(r for r in rows if r["path"] == "auto")
        print(f"auto vs best measured ({best['path']}): {100 * (auto['ms'] / best['ms'] - 1):+.1f}%")


def run_p(args, p, bed, env, root):
    """Run the worker on P ranks (on the test bed when ``bed``), print its table, return its results."""
    from tests.comm.mpirun import mpiexec
    argv = [sys.executable, os.path.abspath(__file__), "--worker",
            "--vocab", ",".join(map(str, args.vocab)), "--dim", str(args.dim), "--tokens", str(args.tokens),
            "--iterations", str(args.iterations), "--group-size", str(args.group_size)]
    if bed is not None:
        proc = bed.run(argv, hosts=p, env={k: env[k] for k in ("PYTHONPATH", "LAYERFORGE_COMM_CALIBRATION")})
    else:
        proc = subprocess.run([mpiexec(), "-n", str(p), *argv], capture_output=True, text=True, env=env,
                              cwd=root)
    if proc.returncode != 0:
        sys.exit(f"bench_sparse: P = {p} failed: {proc.stderr.strip().splitlines()[-1:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"# P = {p}: alpha {out['cost_params']['alpha'] * 1e6:.1f} us, beta_intra "
          f"{1e-9 / max(out['cost_params']['beta_intra'], 1e-30):.2f} GB/s, gamma "
          f"{1e-9 / max(out['cost_params']['gamma'], 1e-30):.2f} GB/s (calibrated)")
    print_table(out["results"])
    return out["results"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ps", default="2,4")
    ap.add_argument("--vocab", default="10000,50000")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=700)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--group-size", type=int, default=0, help="pretend groups of this many ranks (0: shared memory)")
    ap.add_argument("--testbed-gbit", type=float, default=0,
                    help="run each P as P hosts of one rank on the multi-host test bed (layerforge.comm.testbed) "
                         "with links of this many Gbit/s (needs root); 0: ranks on this host")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.vocab = [int(v) for v in str(args.vocab).split(",")]
    if args.worker:
        return worker(args)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if "LAYERFORGE_COMM_CALIBRATION" not in os.environ:  # calibrate under the conditions measured now
        import tempfile
        env["LAYERFORGE_COMM_CALIBRATION"] = os.path.join(tempfile.mkdtemp(prefix="bench_sparse"), "calibration.json")
    print(f"# uptime: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} on "
          f"{os.cpu_count()} cores; Zipf exponent {ZIPF_EXPONENT}")
    everything = []
    ps = [int(x) for x in args.ps.split(",")]
    with contextlib.ExitStack() as stack:  # the test bed is torn down however the loop ends
        bed = None
        if args.testbed_gbit:
            from layerforge.comm.testbed import TestBed
            bed = stack.enter_context(TestBed(max(ps), gbit=args.testbed_gbit, prefix="lfsparse"))
            print(f"# on the test bed: {bed.describe()}, one rank per host")
        for p in ps:
            everything += run_p(args, p, bed, env, root)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
