"""ChainerMN's hierarchical allreduce: reduce inside each group (node) to its leader, Rabenseifner among
the leaders, broadcast inside each group.

Only the leaders' exchange crosses group boundaries, so the slow links carry 2 n (G-1)/G bytes per leader
whatever the ranks per node; inside a group, binomial trees move n bytes per step (log2 q steps each way).
Cost (n bytes, q ranks per group, G groups; pof2 rounding as in :mod:`.cost_model`):
    2 ceil(log2 q) (alpha + n beta_intra) + ceil(log2 q) n gamma + Rabenseifner(G leaders, beta_inter).
"""
import numpy

from .buffers import prepare
from .recursive import halving_doubling, mpich_schedule


def group_members(comm):
    """This rank's group, its ranks in ascending order (the first is the leader), and the leaders of all groups."""
    members = [r for r in range(comm.size) if comm.group_of[r] == comm.group_of[comm.rank]]
    leaders = sorted({min(r for r in range(comm.size) if comm.group_of[r] == g) for g in set(comm.group_of)})
    return members, leaders


def tree_reduce(comm, buf, members):
    """Binomial-tree sum of ``buf`` over ``members`` into ``members[0]`` (others' ``buf`` are left partial)."""
    me, k = members.index(comm.rank), len(members)
    tmp = comm.scratch(buf.size, buf.dtype) if k > 1 else None
    step = 1
    while step < k:
        if me % (2 * step) == step:
            comm.send(buf, members[me - step])
            return
        if me % (2 * step) == 0 and me + step < k:
            comm.recv(tmp, members[me + step])
            numpy.add(buf, tmp, out=buf)
        step *= 2


def tree_broadcast(comm, buf, members):
    """Binomial-tree broadcast of ``members[0]``'s ``buf`` to every member (the reduce's steps reversed)."""
    me, k = members.index(comm.rank), len(members)
    step = 1
    while step < k:
        step *= 2
    while step > 1:
        step //= 2
        if me % (2 * step) == 0 and me + step < k:
            comm.send(buf, members[me + step])
        elif me % (2 * step) == step:
            comm.recv(buf, members[me - step])


def allreduce_hierarchical(comm, sendbuf, recvbuf=None):
    """Sum over all ranks: group reduce -> leaders' Rabenseifner -> group broadcast; returns the result array."""
    buf = prepare(sendbuf, recvbuf)
    if comm.size > 1:
        members, leaders = group_members(comm)
        tree_reduce(comm, buf, members)
        if comm.rank == members[0] and len(leaders) > 1:
            halving_doubling(comm, buf, *mpich_schedule(leaders))
        tree_broadcast(comm, buf, members)
    return sendbuf if recvbuf is None else recvbuf
