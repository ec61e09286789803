"""Ring allreduce: p-1 reduce-scatter steps then p-1 allgather steps, each moving one n/p block to the right.

Cost: 2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma. Bandwidth-optimal like Rabenseifner but with
p-1 latencies instead of log2(p); every step waits for the slowest link, so the ring visits groups in order
(one crossing per group boundary) and still pays the inter-group beta on every step.
"""
import numpy

from .buffers import block_starts, prepare


def ring_order(group_of):
    """Ranks sorted by group, so neighbours on the ring share a group wherever possible."""
    return sorted(range(len(group_of)), key=lambda r: (group_of[r], r))


def allreduce_ring(comm, sendbuf, recvbuf=None):
    """Sum over all ranks with the ring algorithm; in place when ``recvbuf`` is None; returns the result."""
    buf = prepare(sendbuf, recvbuf)
    p = comm.size
    if p > 1:
        ring = ring_order(comm.group_of)
        me = ring.index(comm.rank)
        right, left = ring[(me + 1) % p], ring[(me - 1) % p]
        s = block_starts(buf.size, p)
        tmp = comm.scratch(s[1] - s[0], buf.dtype)
        for step in range(p - 1):
            out, into = (me - step) % p, (me - step - 1) % p
            part = tmp[:s[into + 1] - s[into]]
            comm.sendrecv(buf[s[out]:s[out + 1]], right, part, left)
            numpy.add(buf[s[into]:s[into + 1]], part, out=buf[s[into]:s[into + 1]])
        for step in range(p - 1):
            out, into = (me - step + 1) % p, (me - step) % p
            comm.sendrecv(buf[s[out]:s[out + 1]], right, buf[s[into]:s[into + 1]], left)
    return sendbuf if recvbuf is None else recvbuf
