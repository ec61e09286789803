"""Run under ``mpiexec -n 2 python tests/emulator/nccl_worker.py`` with LAYERFORGE_EMULATED_GPU=1 by
test_nccl.py: NCCL through the emulated cupy across MPI ranks (one device each), raw and through
layerforge.comm.nccl; prints one ``ok`` line per rank."""
import numpy
from mpi4py import MPI

import layerforge  # noqa: F401 - installs the emulated cupy (LAYERFORGE_EMULATED_GPU)
from layerforge.comm import nccl as lf_nccl
from layerforge.comm.communicator import Communicator

import cupy  # noqa: E402 - the emulated one
from cupy.cuda import nccl  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
cupy.cuda.Device(rank).use()
uid = nccl.get_unique_id() if rank == 0 else None
uid = comm.bcast(uid)
nc = nccl.NcclCommunicator(size, uid, rank)
stream = cupy.cuda.Stream(non_blocking=True)
x = cupy.asarray(numpy.arange(6, dtype=numpy.float32) + rank)
out = cupy.empty_like(x)
stream.wait_event(cupy.cuda.Stream.null.record())  # x was copied on the legacy stream
nc.allReduce(x.data.ptr, out.data.ptr, 6, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
stream.synchronize()
assert (out.get() == 2 * numpy.arange(6) + sum(range(size))).all(), out.get()
b = cupy.full(3, rank + 10, numpy.float64)
nc.bcast(b.data.ptr, 3, nccl.NCCL_FLOAT64, 1, 0)
assert (b.get() == 11).all(), b.get()
grads = numpy.full(5, rank + 1.0, numpy.float32)  # layerforge's allreduce, host buffer in and out
lf_nccl.allreduce_nccl(Communicator(comm), grads)
assert (grads == sum(r + 1 for r in range(size))).all(), grads
ranks = comm.gather(rank, root=0)  # one line from rank 0: hydra may interleave two ranks' output mid-line
if rank == 0:
    print("ok", *sorted(ranks), flush=True)
