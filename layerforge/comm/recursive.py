"""Rabenseifner's allreduce (recursive-halving reduce-scatter + recursive-doubling allgather) and plain
recursive doubling, for any process count and any length.

Non-powers of two are folded in as MPICH does: with pof2 the largest power of two <= p and r = p - pof2, the
first 2r logical ranks pair up (even sends its whole vector to odd, which adds), the pof2 survivors run the
power-of-two algorithm, and each odd rank sends the result back to its even partner.

Cost (Thakur, Rabenseifner & Gropp 2005; n bytes, p a power of two):
    Rabenseifner        2 log2(p) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma
    recursive doubling  log2(p) (alpha + n beta + n gamma)
    folding (p not pof2) adds 2 alpha + 2 n beta + n gamma.
"""
import numpy

from .buffers import block_starts, prepare


def mpich_schedule(order):
    """MPICH's folding of logical ``order``: ``(folds, core)``.

    ``folds`` lists (extra, partner) physical ranks: logical 2i sends into 2i+1 for i < r; ``core`` is the
    logical -> physical order of the pof2 survivors (1, 3, .., 2r-1, 2r, .., p-1 in logical ranks).
    """
    p = len(order)
    r = p - (1 << (p.bit_length() - 1))
    folds = tuple((order[2 * i], order[2 * i + 1]) for i in range(r))
    return folds, tuple(order[2 * i + 1] for i in range(r)) + tuple(order[2 * r:])


def _fold(comm, buf, folds):
    """Fold the extra ranks into their partners; False on a rank that sits the core algorithm out."""
    for extra, partner in folds:
        if comm.rank == extra:
            comm.send(buf, partner)
            return False
        if comm.rank == partner:
            tmp = comm.scratch(buf.size, buf.dtype)
            comm.recv(tmp, extra)
            numpy.add(buf, tmp, out=buf)
    return True


def _unfold(comm, buf, folds):
    for extra, partner in folds:
        if comm.rank == partner:
            comm.send(buf, extra)
        elif comm.rank == extra:
            comm.recv(buf, partner)


def halving_doubling(comm, buf, folds, core):
    """Rabenseifner on ``buf`` (1-D, in place); ``core`` the pof2 survivors' logical -> physical order.

    The halving starts at logical distance pof2/2 (swCaffe's schedule): the first step exchanges half the
    vector with the partner furthest away, and each later step halves distance and data. Block i of pof2
    near-equal blocks ends up reduced on survivor i, then the allgather replays the steps in reverse.
    """
    if _fold(comm, buf, folds):
        pof2, newrank = len(core), core.index(comm.rank)
        s = block_starts(buf.size, pof2)
        tmp = comm.scratch(s[pof2 // 2], buf.dtype)
        lo, hi, steps, d = 0, pof2, [], pof2 // 2
        while d >= 1:
            partner = core[newrank ^ d]
            mid = (lo + hi) // 2
            keep, give = ((mid, hi), (lo, mid)) if newrank & d else ((lo, mid), (mid, hi))
            k0, k1 = s[keep[0]], s[keep[1]]
            comm.sendrecv(buf[s[give[0]]:s[give[1]]], partner, tmp[:k1 - k0], partner)
            numpy.add(buf[k0:k1], tmp[:k1 - k0], out=buf[k0:k1])
            steps.append((partner, k0, k1, s[give[0]], s[give[1]]))
            lo, hi = keep
            d //= 2
        for partner, k0, k1, g0, g1 in reversed(steps):
            comm.sendrecv(buf[k0:k1], partner, buf[g0:g1], partner)
    _unfold(comm, buf, folds)


def doubling(comm, buf, folds, core):
    """Recursive doubling: log2(pof2) exchanges of the whole vector, distance 1 first (latency-bound sizes)."""
    if _fold(comm, buf, folds):
        newrank = core.index(comm.rank)
        tmp = comm.scratch(buf.size, buf.dtype)
        d = 1
        while d < len(core):
            partner = core[newrank ^ d]
            comm.sendrecv(buf, partner, tmp, partner)
            numpy.add(buf, tmp, out=buf)  # a + b == b + a exactly, so both partners hold identical sums
            d *= 2
    _unfold(comm, buf, folds)


def allreduce_recursive(comm, sendbuf, recvbuf=None):
    """Rabenseifner over ranks in their natural order (swCaffe's plain mapping); returns the reduced array."""
    buf = prepare(sendbuf, recvbuf)
    if comm.size > 1:
        halving_doubling(comm, buf, *mpich_schedule(range(comm.size)))
    return sendbuf if recvbuf is None else recvbuf


def allreduce_doubling(comm, sendbuf, recvbuf=None):
    """Recursive doubling over ranks in natural order; best for short vectors (few alpha, n beta each step)."""
    buf = prepare(sendbuf, recvbuf)
    if comm.size > 1:
        doubling(comm, buf, *mpich_schedule(range(comm.size)))
    return sendbuf if recvbuf is None else recvbuf
