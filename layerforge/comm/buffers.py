"""Buffer plumbing shared by the algorithms: one signature, in place or not, any payload dtype."""
import numpy
from mpi4py import MPI

DTYPES = (numpy.float16, numpy.float32, numpy.float64)


def prepare(sendbuf, recvbuf):
    """The 1-D contiguous array an algorithm reduces in place, holding this rank's contribution.

    ``(buf, None)``, ``(buf, buf)`` and ``(MPI.IN_PLACE, buf)`` all mean in place; otherwise ``sendbuf`` is
    copied into ``recvbuf`` first. Both must be C-contiguous so the 1-D view shares their memory.
    """
    out = sendbuf if recvbuf is None else recvbuf
    if out is MPI.IN_PLACE or not isinstance(out, numpy.ndarray):
        raise TypeError("allreduce needs a numpy receive buffer")
    if out.dtype not in DTYPES:
        raise TypeError(f"allreduce payloads are float16/float32/float64, got {out.dtype}")
    if not out.flags.c_contiguous:
        raise ValueError("allreduce buffers must be C-contiguous")
    flat = out.reshape(-1)
    if sendbuf is not MPI.IN_PLACE and sendbuf is not out:
        if sendbuf.size != out.size or sendbuf.dtype != out.dtype:
            raise ValueError(f"send {sendbuf.dtype}{sendbuf.shape} and receive {out.dtype}{out.shape} differ")
        numpy.copyto(flat, sendbuf.reshape(-1))
    return flat


def block_starts(n, k):
    """Boundaries of ``k`` near-equal blocks of ``n`` elements: block i is ``[s[i], s[i+1])``.

    The first ``n % k`` blocks get one element more, so any n (also n < k: empty blocks) works.
    """
    base, extra = divmod(n, k)
    return [i * base + min(i, extra) for i in range(k + 1)]
