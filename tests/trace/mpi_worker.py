"""Run under ``mpiexec -n P python tests/trace/mpi_worker.py FILE MODE`` by test_mpi.py.

Rank r's recorder clock is made to read ``r * 5`` s ahead (as on another host). Each of iterations 0-3 starts with
a barrier, after which every rank records a span "after barrier" at once, then an allreduce inside a comm span
(on a communication thread, the compute thread waiting for it) and an update. MODE ``gather``: rank 0 writes FILE
with every rank's spans on its clock; ``per-rank``: each rank writes FILE.rank<R>.json for ``trace merge``.
"""
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy
from mpi4py import MPI

from layerforge import trace
from layerforge.trace import clocks as time_base, recorder

path, mode = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD
skew = 5.0 * comm.rank
real_clock = time_base.clock
recorder.clock = time_base.clock = lambda: real_clock() + skew  # both readers of the time base

trace.start(path, iterations=(1, 3), comm=comm)
comm_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="layerforge-comm")  # as GradientExchange's
for k in range(4):
    trace.iteration(k)
    comm.Barrier()
    with trace.span("forward", "after barrier"):
        time.sleep(0.002)
    x = numpy.full(1000, float(comm.rank))

    def exchange():
        with trace.span("comm", "bucket 0", bytes=x.nbytes):
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)

    with trace.span("backward", "ip1"):
        future = comm_thread.submit(exchange)
        time.sleep(0.003)
    with trace.wait("comm"):
        future.result()
    assert x[0] == sum(range(comm.size))
    with trace.span("update", "sgd"):
        pass
written = trace.finish(comm=comm, per_rank=mode == "per-rank")
print(f"rank {comm.rank} wrote {written}", flush=True)
