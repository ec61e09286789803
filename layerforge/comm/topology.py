"""Topology-aware Rabenseifner (swCaffe, Fang et al. 2018) and the byte counts that show which steps cross.

The halving schedule starts at logical distance p/2 and exchanges n*d/p bytes at distance d (reduce-scatter
and allgather alike). With ranks numbered group by group (plain mapping, groups of q), every distance d >= q
crosses groups, so the *large* steps go over the slow links. Assigning logical ranks round-robin across the
G = p/q groups (logical i lives in group i mod G) makes every distance that is a multiple of G stay inside a
group: only the last reduce-scatter steps and the first allgather steps (d < G, the small ones) cross.

Bytes sent per rank for an n-byte vector (p, q powers of two, n divisible by p), the swCaffe counts:
    eq. 3  plain    intra-group  2 n (q - 1) / p
    eq. 4  plain    inter-group  2 n (p - q) / p
    eq. 5  topology intra-group  2 n (p - p/q) / p
    eq. 6  topology inter-group  2 n (p/q - 1) / p
so the inter-group bytes drop by the factor (p - q) / (p/q - 1) = q.
"""
import functools

from .buffers import prepare
from .recursive import halving_doubling


def round_robin_order(group_of):
    """Logical -> physical rank list dealing ranks round-robin across groups.

    ``group_of[r]`` is rank r's group; logical rank i takes the (i // G)-th member of group (i mod G) for
    equal groups, and unequal groups simply drop out of the rotation when exhausted.
    """
    members = {}
    for rank, g in enumerate(group_of):
        members.setdefault(g, []).append(rank)
    columns = list(members.values())
    order = []
    for i in range(max(len(c) for c in columns)):
        order.extend(c[i] for c in columns if i < len(c))
    return order


@functools.lru_cache(maxsize=32)
def topology_schedule(group_of):
    """``(folds, core)`` for Rabenseifner on groups ``group_of`` (a tuple, group id per rank).

    When p is not a power of two the r = p - pof2 extra ranks fold into a partner in their own group (taken
    from the groups with the most ranks left, so the survivors stay balanced); the pof2 survivors are then
    ordered round-robin across groups.
    """
    p = len(group_of)
    r = p - (1 << (p.bit_length() - 1))
    free = {}
    for rank, g in enumerate(group_of):
        free.setdefault(g, []).append(rank)
    left = {g: len(m) for g, m in free.items()}
    folds = []
    for _ in range(r):
        pairable = [g for g in free if len(free[g]) >= 2]
        if pairable:
            g = max(pairable, key=lambda g: (left[g], -g))
            extra, partner = free[g].pop(), free[g].pop()
        else:  # only singletons left: this fold has to cross groups
            g, h = sorted((g for g in free if free[g]), key=lambda g: (-left[g], g))[:2]
            extra, partner = free[g].pop(), free[h].pop()
        left[g] -= 1
        folds.append((extra, partner))
    extras = {e for e, _ in folds}
    survivors = [rank for rank in range(p) if rank not in extras]
    core = round_robin_order([group_of[rank] for rank in survivors])
    return tuple(folds), tuple(survivors[i] for i in core)


def allreduce_topology(comm, sendbuf, recvbuf=None):
    """Rabenseifner with :func:`topology_schedule` over ``comm.group_of``; returns the reduced array."""
    buf = prepare(sendbuf, recvbuf)
    if comm.size > 1:
        halving_doubling(comm, buf, *topology_schedule(tuple(comm.group_of)))
    return sendbuf if recvbuf is None else recvbuf


def plain_intra_bytes(n, p, q):
    """swCaffe eq. 3: intra-group bytes one rank sends, plain mapping (n bytes, p ranks, groups of q)."""
    return 2 * n * (q - 1) // p


def plain_inter_bytes(n, p, q):
    """swCaffe eq. 4: inter-group bytes one rank sends, plain mapping."""
    return 2 * n * (p - q) // p


def topology_intra_bytes(n, p, q):
    """swCaffe eq. 5: intra-group bytes one rank sends, round-robin mapping."""
    return 2 * n * (p - p // q) // p


def topology_inter_bytes(n, p, q):
    """swCaffe eq. 6: inter-group bytes one rank sends, round-robin mapping."""
    return 2 * n * (p // q - 1) // p
