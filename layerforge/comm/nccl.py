"""NCCL allreduce through ``cupy.cuda.nccl``, for device buffers; importing this module never needs cupy.

The NCCL unique id is made on rank 0 and broadcast as raw bytes over MPI once per Communicator. Host
(numpy) buffers are copied to the device and back, so the algorithm can be benchmarked like the others.
NCCL's traffic is not visible here: it adds nothing to the byte counters.
"""
import sys

import numpy

from .buffers import DTYPES


def available():
    """True when cupy with NCCL and a CUDA device can be used."""
    try:
        import cupy
        from cupy.cuda import nccl

        # cupy.cuda.nccl imports without libnccl and says so in ``available``
        return bool(nccl.available) and cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, no NCCL build, no driver: not available
        return False


def _nccl_comm(comm):
    nc = getattr(comm, "_nccl", None)
    if nc is None:
        from cupy.cuda import nccl

        uid = numpy.zeros(128, numpy.uint8)  # NCCL_UNIQUE_ID_BYTES
        if comm.rank == 0:
            uid[:] = numpy.frombuffer(unique_id_bytes(nccl.get_unique_id()), numpy.uint8)
        comm.bcast(uid)
        nc = comm._nccl = nccl.NcclCommunicator(comm.size, communicator_id(uid.tobytes()), comm.rank)
    return nc


def unique_id_bytes(uid):
    """NCCL's unique id as 128 raw bytes: cupy >= 14 returns bytes, older cupy a tuple of signed chars."""
    return uid if isinstance(uid, bytes) else numpy.array(uid, numpy.int8).view(numpy.uint8).tobytes()


def communicator_id(raw):
    """The id in the form this cupy's ``NcclCommunicator`` takes: bytes from cupy 14 on, a tuple of ints before."""
    import cupy

    if int(cupy.__version__.split(".")[0]) >= 14:
        return raw
    return tuple(int(v) for v in numpy.frombuffer(raw, numpy.int8))


def allreduce_nccl(comm, sendbuf, recvbuf=None):
    """``ncclAllReduce`` (sum) on the current stream; in place when ``recvbuf`` is None; returns the result.

    Returns with the collective done, as every algorithm of the table does (an MPI call returns only then):
    ``bench-allreduce`` times the call, and a Communicator's deadline sees this rank wait for a late one only
    while it waits inside the call. NCCL only queues the collective, hence the host wait for the stream.
    """
    cupy = sys.modules.get("cupy")
    if cupy is None or not available():
        raise RuntimeError("the nccl allreduce needs cupy with NCCL and a CUDA device")
    from cupy.cuda import nccl

    out = sendbuf if recvbuf is None else recvbuf
    if out.dtype not in DTYPES:
        raise TypeError(f"allreduce payloads are float16/float32/float64, got {out.dtype}")
    dev = out if isinstance(out, cupy.ndarray) else cupy.asarray(out)
    in_place = sendbuf is out or not hasattr(sendbuf, "dtype")  # also MPI.IN_PLACE
    src = dev if in_place else cupy.asarray(sendbuf)
    stream = cupy.cuda.get_current_stream()
    _nccl_comm(comm).allReduce(src.data.ptr, dev.data.ptr, dev.size, _nccl_type(out.dtype), nccl.NCCL_SUM, stream.ptr)
    stream.synchronize()
    if dev is not out:
        out[...] = dev.get()
    return out


def broadcast_nccl(comm, buf, root=0):
    """``ncclBcast`` of the device array ``buf`` from rank ``root`` to every rank, in place, queued on the current
    stream: whatever reads ``buf`` next on that stream, or through ``.get()``, comes after it (pycaffe's
    ``NCCL.bcast``: training reads the weights there, or on a stream that first waits for it)."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    _nccl_comm(comm).bcast(buf.data.ptr, buf.size, _nccl_type(buf.dtype), root, stream.ptr)
    return buf


def _nccl_type(dtype):
    from cupy.cuda import nccl

    return {numpy.dtype(numpy.float16): nccl.NCCL_FLOAT16, numpy.dtype(numpy.float32): nccl.NCCL_FLOAT32,
            numpy.dtype(numpy.float64): nccl.NCCL_FLOAT64}[numpy.dtype(dtype)]
