"""``layerforge bench_allreduce``: latency, algbw and busbw of every allreduce algorithm, next to MPI's own.

Run it under the launcher, e.g. ``mpiexec -n 4 layerforge bench_allreduce --sizes 1K,1M,100M``. For each
size and algorithm the time is the slowest rank's, median over ``--iterations`` (after one warm-up);
algbw = bytes / time and busbw = algbw * 2(p-1)/p (the nccl-tests definition, comparable across p).
Bytes sent are per rank (mean over ranks), split inside / between groups.
"""
import json
import re
import sys
import time

import numpy

from ..errors import ConfigError

HELP = "Measure allreduce latency, algbw and busbw per algorithm and message size (run under mpiexec)."

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """``"1K"`` -> 1024, ``"100M"`` -> 104857600 bytes (binary units, as nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ConfigError(f"cannot read size {text!r}; use e.g. 1K, 1M, 100M", key="--sizes")
    return max(1, int(float(m.group(1)) * _UNITS[m.group(2).upper()]))


def add_arguments(parser):
    parser.add_argument("--sizes", default="1K,1M,100M", help="comma-separated message sizes in bytes (K, M, G)")
    parser.add_argument("--algorithms", default="all", help="comma-separated names, or 'all'")
    parser.add_argument("--iterations", type=int, default=5, help="timed repetitions per size and algorithm")
    parser.add_argument("--warmup", type=int, default=1, help="untimed repetitions first")
    parser.add_argument("--group-size", type=int, default=None,
                        help="ranks per group (pretend nodes on one host); default: shared-memory nodes")
    parser.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


def _measure(comm, name, nbytes, dtype, iterations, warmup):
    from mpi4py import MPI

    xp = numpy
    if name == "nccl":
        import cupy as xp
    n = max(1, nbytes // numpy.dtype(dtype).itemsize)
    buf = xp.empty(n, dtype)
    times = []
    for it in range(warmup + iterations):
        buf.fill(comm.rank + 1)
        comm.reset_counters()
        comm.barrier()
        t0 = time.perf_counter()
        comm.allreduce(buf, algorithm=name)
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    ok = numpy.array([float(xp.abs(buf - comm.size * (comm.size + 1) / 2).max()) == 0.0])
    slowest = numpy.array(times)
    comm.comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
    comm.comm.Allreduce(MPI.IN_PLACE, ok, op=MPI.LAND)
    sent = numpy.array([comm.bytes_sent["intra"], comm.bytes_sent["inter"]], numpy.float64)
    comm.comm.Allreduce(MPI.IN_PLACE, sent, op=MPI.SUM)
    latency = float(numpy.median(slowest))
    nbytes = n * numpy.dtype(dtype).itemsize
    algbw = nbytes / latency
    p = comm.size
    counted = name not in ("mpi", "nccl")
    return {"bytes": nbytes, "algorithm": name, "chosen": getattr(comm, "last_choice", None) if name == "auto"
            else None, "latency_s": latency, "algbw_GBps": algbw / 1e9, "busbw_GBps": algbw * 2 * (p - 1) / p / 1e9,
            "intra_bytes": sent[0] / p if counted else None, "inter_bytes": sent[1] / p if counted else None,
            "correct": bool(ok[0])}


def _fmt_bytes(b):
    if b is None:
        return "-"
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.4g}{unit}"
    return f"{b:.0f}"


def _print_table(doc):
    print(f"# allreduce: p={doc['p']} groups={doc['groups']}x{doc['group_size']} dtype={doc['dtype']} "
          f"{doc['library']}; time = slowest rank, median of {doc['iterations']}")
    head = f"{'size':>8} {'algorithm':<16} {'latency':>11} {'algbw GB/s':>11} {'busbw GB/s':>11} " \
           f"{'vs mpi':>7} {'intra/rank':>11} {'inter/rank':>11}"
    print(head)
    mpi = {r["bytes"]: r["busbw_GBps"] for r in doc["results"] if r["algorithm"] == "mpi"}
    for r in doc["results"]:
        name = r["algorithm"] + (f"({r['chosen']})" if r["chosen"] else "") + ("" if r["correct"] else " WRONG")
        ratio = f"{r['busbw_GBps'] / mpi[r['bytes']]:.2f}" if mpi.get(r["bytes"]) else "-"
        lat = r["latency_s"]
        lat = f"{lat * 1e6:.1f} us" if lat < 1e-3 else f"{lat * 1e3:.2f} ms"
        print(f"{_fmt_bytes(r['bytes']):>8} {name:<16} {lat:>11} {r['algbw_GBps']:>11.3f} {r['busbw_GBps']:>11.3f} "
              f"{ratio:>7} {_fmt_bytes(r['intra_bytes']):>11} {_fmt_bytes(r['inter_bytes']):>11}")


def run(args):
    from mpi4py import MPI

    from ..comm import Communicator, available_algorithms, get_algorithm, launch_guard

    with launch_guard():
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        names = available_algorithms() if args.algorithms == "all" else [a.strip() for a in args.algorithms.split(",")]
        for name in names:
            try:
                get_algorithm(name)
            except KeyError as e:
                raise ConfigError(e.args[0], key="--algorithms") from None
        if args.iterations < 1:
            raise ConfigError("must be >= 1", key="--iterations")
        comm = Communicator(group_size=args.group_size)
        results = [_measure(comm, name, size, args.dtype, args.iterations, args.warmup)
                   for size in sizes for name in names]
        doc = {"p": comm.size, "groups": comm.num_groups, "group_size": comm.group_size, "dtype": args.dtype,
               "iterations": args.iterations, "library": MPI.Get_library_version().splitlines()[0].strip(),
               "results": results}
        if comm.rank == 0:
            if args.json:
                json.dump(doc, sys.stdout, indent=1)
                print()
            else:
                _print_table(doc)
            sys.stdout.flush()
        return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":  # usable before/without the CLI entry: mpiexec -n 4 python -m <this module>
    import argparse

    _parser = argparse.ArgumentParser(prog="layerforge bench_allreduce", description=HELP)
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
