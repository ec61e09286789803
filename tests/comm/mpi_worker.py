"""Run under ``mpiexec -n P python tests/comm/mpi_worker.py MODE ...`` by the tests in this folder.

Modes:
  sums [Q]       every algorithm x dtype x length x in-place/out-of-place equals the numpy sum (groups of Q)
  bytes N Q      rank 0 prints one JSON line per algorithm: bytes sent per rank, intra and inter (N bytes)
  raise          rank 1 raises ValueError("boom") inside the launch guard
  kill           rank 1 SIGKILLs itself while the others wait in an allreduce
  stall T ALG [busy]  allreduces with a deadline of T s (algorithm ALG); rank 1 SIGSTOPs itself at the tenth
                 (busy: it sleeps 60 s there instead, alive but late)

With $LAYERFORGE_TEST_SEGMENTS=PREFIX, each rank first writes the MPICH shared-memory files it maps to PREFIX.RANK.
"""
import json
import os
import signal
import sys
import time

import numpy
from mpi4py import MPI

from layerforge.comm import Communicator, CostParams, launch_guard

ALGS = ("recursive", "topology", "ring", "doubling", "hierarchical", "mpi", "auto")


def contribution(rank, n, dtype):
    """Small integers, distinct per rank, so every summation order gives the exact same float16 sum."""
    i = numpy.arange(n)
    return (((rank * 7 + i * 3) % 11) - 5).astype(dtype)


def check_sums(comm):
    p = comm.size
    lengths = sorted({1, 2, 3, max(p - 1, 1), p + 1, 1000, 4099})
    failures = 0
    for dtype in (numpy.float16, numpy.float32, numpy.float64):
        for n in lengths + ([999_999] if dtype == numpy.float32 else []):
            want = sum(contribution(r, n, numpy.float64) for r in range(p))
            for alg in ALGS:
                for in_place in (True, False):
                    x = contribution(comm.rank, n, dtype)
                    if in_place:
                        got = comm.allreduce(x, algorithm=alg)
                        ok = got is x
                    else:
                        out = numpy.full(n, numpy.nan, dtype)
                        got = comm.allreduce(x, out, algorithm=alg)
                        ok = got is out and numpy.array_equal(x, contribution(comm.rank, n, dtype))
                    if not (ok and got.dtype == dtype and numpy.array_equal(got.astype(numpy.float64), want)):
                        failures += 1
                        print(f"rank {comm.rank}: FAIL {alg} {numpy.dtype(dtype).name} n={n} "
                              f"in_place={in_place}", file=sys.stderr)
    # random float64 data in a 2-D buffer: tolerance, since summation orders differ between algorithms
    rs = numpy.random.RandomState(comm.rank)
    x = rs.randn(37, 29)
    want = sum(numpy.random.RandomState(r).randn(37, 29) for r in range(p))
    for alg in ALGS:
        got = comm.allreduce(x.copy(), algorithm=alg)
        if not numpy.allclose(got, want, rtol=1e-12, atol=1e-12):
            failures += 1
            print(f"rank {comm.rank}: FAIL random {alg}", file=sys.stderr)
    m = comm.mean(numpy.full(3, comm.rank, numpy.float64), algorithm="recursive")
    failures += not numpy.allclose(m, (p - 1) / 2)
    b = numpy.arange(4.0) if comm.rank == 0 else numpy.zeros(4)
    failures += not numpy.array_equal(comm.bcast(b), numpy.arange(4.0))
    total = numpy.array([failures])
    comm.comm.Allreduce(MPI.IN_PLACE, total)
    if comm.rank == 0:
        print(f"OK p={p}" if total[0] == 0 else f"FAILURES {total[0]}")
    return int(total[0] != 0)


def report_bytes(comm, nbytes):
    for alg in ("recursive", "topology", "ring", "doubling", "hierarchical"):
        comm.reset_counters()
        comm.allreduce(numpy.ones(nbytes // 4, numpy.float32), algorithm=alg)
        counts = numpy.array([comm.bytes_sent["intra"], comm.bytes_sent["inter"]], numpy.int64)
        table = numpy.empty((comm.size, 2), numpy.int64)
        comm.comm.Allgather(counts, table)
        if comm.rank == 0:
            print(json.dumps({"algorithm": alg, "intra": table[:, 0].tolist(), "inter": table[:, 1].tolist()}))
    return 0


def main(argv):
    mode = argv[1]
    with launch_guard():
        # fixed model parameters: no calibration file written by tests
        params = CostParams(alpha=2e-6, beta_intra=3e-10, beta_inter=1e-9, gamma=2e-10)
        group_size = int(argv[3]) if mode == "bytes" else (int(argv[2]) if mode == "sums" and len(argv) > 2 else None)
        timeout = float(argv[2]) if mode == "stall" else None
        comm = Communicator(group_size=group_size, cost_params=params, timeout=timeout)
        if os.environ.get("LAYERFORGE_TEST_SEGMENTS"):  # mpirun.SEGMENTS_TO
            from layerforge.launcher import mapped_segments

            with open(f"{os.environ['LAYERFORGE_TEST_SEGMENTS']}.{comm.rank}", "w") as f:
                f.write("".join(f"{path}\n" for path in mapped_segments()))
        if mode == "sums":
            return check_sums(comm)
        if mode == "bytes":
            return report_bytes(comm, int(argv[2]))
        if mode == "raise":
            if comm.rank == 1:
                time.sleep(0.2)
                raise ValueError("boom")
            comm.allreduce(numpy.zeros(10), algorithm="recursive")
        if mode == "kill":
            if comm.rank == 1:
                time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGKILL)
            comm.allreduce(numpy.zeros(10), algorithm="ring")
        if mode == "stall":
            for i in range(1000):
                if i == 10 and comm.rank == 1 and argv[4:] == ["busy"]:
                    time.sleep(60)  # as a rank writing a long snapshot
                elif i == 10 and comm.rank == 1:
                    os.kill(os.getpid(), signal.SIGSTOP)  # as a swapped-out or stopped process
                comm.allreduce(numpy.ones(1000), algorithm=argv[3])
                time.sleep(0.01)
        time.sleep(60)  # a rank still here when the job should have died shows up as a timeout
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
