"""NCCL on the emulated devices: collectives across two devices of one process (a thread each) and across two
MPI ranks under mpiexec, ordered on their streams."""
import os
import threading

import numpy
import pytest

from layerforge_emulator import nccl as emulated_nccl
from tests.comm.mpirun import run_mpi
from tests.emulator.emulated import cupy  # noqa: F401 - the fixture


def on_devices(cupy, work, n=2):
    """``work(rank, communicator)`` in one thread per device; the results by rank (errors re-raised)."""
    from cupy.cuda import nccl

    uid, results, errors = nccl.get_unique_id(), [None] * n, []

    def run(rank):
        try:
            with cupy.cuda.Device(rank):
                results[rank] = work(rank, nccl.NcclCommunicator(n, uid, rank))
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("op, expected", [("NCCL_SUM", [1, 3, 5]), ("NCCL_MAX", [1, 2, 3]), ("NCCL_AVG", [0.5, 1.5, 2.5])])
def test_allreduce_across_two_devices(cupy, op, expected):
    from cupy.cuda import nccl

    def work(rank, comm):
        x = cupy.asarray(numpy.arange(3, dtype=numpy.float32) + rank)
        stream = cupy.cuda.Stream(non_blocking=True)
        comm.allReduce(x.data.ptr, x.data.ptr, 3, nccl.NCCL_FLOAT32, getattr(nccl, op), stream.ptr)
        before = x.get()  # the legacy stream does not wait for `stream`: the collective has not run
        stream.synchronize()
        return before, x.get(), x.device.id

    for rank, (before, after, device) in enumerate(on_devices(cupy, work)):
        assert device == rank and (before == numpy.arange(3) + rank).all()
        numpy.testing.assert_array_equal(after, expected)


def test_broadcast_reduce_and_allgather(cupy):
    from cupy.cuda import nccl

    def work(rank, comm):
        x = cupy.full(4, rank + 1, numpy.float64)
        y = cupy.zeros(4, numpy.float64)
        comm.broadcast(x.data.ptr, y.data.ptr, 4, nccl.NCCL_FLOAT64, 1, 0)
        r = cupy.zeros(4, numpy.float64)
        comm.reduce(x.data.ptr, r.data.ptr, 4, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, 0, 0)
        g = cupy.zeros(8, numpy.float64)
        comm.allGather(x.data.ptr, g.data.ptr, 4, nccl.NCCL_FLOAT64, 0)
        return y.get(), r.get(), g.get()

    (y0, r0, g0), (y1, r1, g1) = on_devices(cupy, work)
    assert (y0 == 2).all() and (y1 == 2).all() and (r0 == 3).all() and (r1 == 0).all()
    assert g0.tolist() == g1.tolist() == [1] * 4 + [2] * 4


def test_mismatched_calls_and_foreign_buffers_are_errors(cupy):
    from cupy.cuda import nccl

    def work(rank, comm):
        x = cupy.zeros(2 + rank, numpy.float32)
        with pytest.raises(nccl.NcclError, match="NCCL_ERROR_INVALID_USAGE"):
            comm.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
            cupy.cuda.Stream.null.synchronize()  # the collective runs when something waits for it
        return True

    assert on_devices(cupy, work) == [True, True]
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    with cupy.cuda.Device(1):
        other = cupy.zeros(2, numpy.float32)
    with pytest.raises(nccl.NcclError, match="is on device 1, the communicator on device 0"):
        comm.allReduce(other.data.ptr, other.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    with pytest.raises(ValueError, match="commId length 3 != 128"):
        nccl.NcclCommunicator(1, b"abc", 0)


def test_a_rank_that_waits_too_long_raises(cupy, monkeypatch):
    from cupy.cuda import nccl

    monkeypatch.setenv(emulated_nccl.TIMEOUT_ENV, "0.5")
    comm = nccl.NcclCommunicator(2, nccl.get_unique_id(), 0)  # rank 1 never comes
    x = cupy.zeros(2, numpy.float32)
    with pytest.raises(nccl.NcclError, match="waited 0.5 s"):
        comm.allReduce(x.data.ptr, x.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
        cupy.cuda.Stream.null.synchronize()


def test_allreduce_and_broadcast_across_two_mpi_ranks():
    worker = os.path.join(os.path.dirname(__file__), "nccl_worker.py")
    proc = run_mpi(2, [worker], timeout=120, env={"LAYERFORGE_EMULATED_GPU": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok", "0", "1"]
