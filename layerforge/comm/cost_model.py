"""The alpha-beta-gamma cost model of Thakur, Rabenseifner & Gropp (2005), calibrated on the running job.

alpha is the latency of one message, beta the time per byte sent (``beta_intra`` inside a group,
``beta_inter`` between groups), gamma the time per byte reduced. For n bytes, p ranks (pof2 = the largest
power of two <= p, L = log2 pof2, r = p - pof2), groups of q (G = pof2/q groups):

    doubling   L alpha + n (log2 q beta_intra + log2 G beta_inter) + L n gamma                + fold
    recursive  2L alpha + 2n (q-1)/P beta_intra + 2n (P-q)/P beta_inter + n (P-1)/P gamma     + fold
    topology   2L alpha + 2n (P-P/q)/P beta_intra + 2n (P/q-1)/P beta_inter + n (P-1)/P gamma + fold
    ring       2(p-1) alpha + 2n (p-1)/p beta_slowest + n (p-1)/p gamma,  beta_slowest = beta_inter / q
    hierarchical  2 l (alpha + n beta_intra) + l n gamma + Rabenseifner over G' leaders with beta_inter / q,
               l = ceil(log2 q), G' = ceil(p / q) groups (its own pof2 folding among the leaders)
    fold       (r > 0) 2 alpha + 2n beta_intra + n gamma

with P = pof2. ``beta_inter`` is what one rank pays per byte while all q ranks of its group cross at once
(that is how :func:`calibrate` measures it, and how the recursive, topology and doubling schedules cross:
every rank in the same step). Ring and hierarchical send one stream per group across at a time, which has
the group's link to itself: beta_inter / q (measured on the multi-host test bed: with 2 ranks per host they
ran at half the time the shared-link formula gave).

Row gradients (:mod:`.sparse`; r = bytes of one row + 8 for its index, n_i the rows of rank
i, N = sum n_i, u the rows of the sum, V the table's rows, beta the slowest link, gamma_c per byte combined):

    sparse dense      the cheapest allreduce above of V (r - 8) bytes + 3 V (r - 8) gamma (zero the table,
                      add the rows, find the non-zero rows of the sum)
    sparse allgather  2 ceil(log2 p) alpha + (N - min n_i) r beta + N (r - 8) gamma_c
    sparse sharded    2 ceil(log2 p) alpha + 2 (p-1) alpha + max(max n_i, N/p) (p-1)/p r beta    (to owners)
                      + u (p-1)/p r beta + (N/p) (r - 8) gamma_c                              (back)
                      with groups of q > 1 (G > 1): + (q-1)(alpha + n r beta_intra) + q n (r - 8) gamma_c
                      to the leader, the sharded exchange over G leaders of min(u, q n) rows each, and
                      a tree broadcast of u rows inside the group, ceil(log2 q) (alpha + u r beta_intra)

gamma_c is the time per byte of summing rows by index (sort + scatter-add), which is several times the
gamma of a contiguous add: :data:`COMBINE_FACTOR` gamma.

``mpi`` is modelled as what MPICH picks (doubling for short vectors, else Rabenseifner with
the distance-1-first order, whose crossings on a group-by-group layout are those of ``topology``).
``auto`` takes the cheapest of :data:`AUTO_CANDIDATES` for each message size.
"""
import dataclasses
import json
import os
import time

import numpy
from mpi4py import MPI

from .ring import ring_order
from .topology import round_robin_order

AUTO_CANDIDATES = ("doubling", "topology", "recursive", "ring")
CACHE_ENV = "LAYERFORGE_COMM_CALIBRATION"


@dataclasses.dataclass(frozen=True)
class CostParams:
    """alpha [s], beta_intra / beta_inter [s per byte sent], gamma [s per byte reduced]."""

    alpha: float
    beta_intra: float
    beta_inter: float
    gamma: float

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        beta = d.get("beta")
        return cls(float(d["alpha"]), float(d.get("beta_intra", beta)), float(d.get("beta_inter", beta)),
                   float(d["gamma"]))


def _shape(p, q):
    pof2 = 1 << (p.bit_length() - 1)
    q = max(1, min(q, pof2))
    return pof2, pof2.bit_length() - 1, q, max(pof2 // q, 1)


def predict(algorithm, nbytes, p, q, params):
    """Predicted seconds for one allreduce of ``nbytes`` over ``p`` ranks in groups of ``q``."""
    a, bi, bx, g = params.alpha, params.beta_intra, params.beta_inter, params.gamma
    n = float(nbytes)
    if p <= 1:
        return 0.0
    q_real = max(1, min(q, p))  # ranks per group as laid out, before the power-of-two schedule's view
    crosses = p > q_real
    P, L, q, G = _shape(p, q)
    fold = (2 * a + 2 * n * bi + n * g) if p > P else 0.0
    if algorithm == "doubling":
        return L * a + n * (numpy.log2(q) * bi + numpy.log2(G) * bx) + L * n * g + fold
    if algorithm == "recursive":
        return 2 * L * a + 2 * n * ((q - 1) * bi + (P - q) * bx) / P + n * (P - 1) / P * g + fold
    if algorithm == "topology":
        return 2 * L * a + 2 * n * ((P - P / q) * bi + (P / q - 1) * bx) / P + n * (P - 1) / P * g + fold
    lone_stream = bx / q_real  # one rank of the group crossing alone gets the whole link
    if algorithm in ("ring", "nccl"):
        slowest = lone_stream if crosses else bi
        return 2 * (p - 1) * a + 2 * n * (p - 1) / p * slowest + n * (p - 1) / p * g
    if algorithm == "hierarchical":
        groups = -(-p // q_real)
        steps = (q_real - 1).bit_length()  # ceil(log2 q)
        inside = 2 * steps * (a + n * bi) + steps * n * g
        leaders = CostParams(a, lone_stream, lone_stream, g)  # only the leaders cross, one per group's link
        return inside + predict("recursive", nbytes, groups, 1, leaders)
    if algorithm == "mpi":
        return min(predict("doubling", nbytes, p, q, params), predict("topology", nbytes, p, q, params))
    raise KeyError(f"no cost formula for allreduce algorithm {algorithm!r}")


def choose(nbytes, p, q, params, candidates=AUTO_CANDIDATES):
    """The candidate with the lowest predicted time (the first one on ties)."""
    return min(candidates, key=lambda name: predict(name, nbytes, p, q, params))


COMBINE_FACTOR = 8.0
SPARSE_PATHS = ("dense", "allgather", "sharded")


def predict_sparse(path, counts, union, row_bytes, num_rows, q, params):
    """Predicted seconds of one sparse aggregation (:mod:`.sparse`) over ``len(counts)`` ranks in groups of ``q``.

    Args:
        counts: rows (unique indices) each rank contributes. union: rows in the sum.
        row_bytes: bytes of one row (D x itemsize). num_rows: rows of the whole table (V).
    """
    p = len(counts)
    if path == "dense":  # the local scatter and scan cost even on one rank
        local = 3 * num_rows * row_bytes * params.gamma
        return local + min(predict(name, num_rows * row_bytes, p, q, params) for name in AUTO_CANDIDATES)
    if p <= 1:
        return 0.0
    a, g = params.alpha, params.gamma * COMBINE_FACTOR
    q = max(1, min(q, p))
    groups = -(-p // q)
    beta = params.beta_inter if groups > 1 else params.beta_intra
    r = row_bytes + 8
    N, L = float(sum(counts)), (p - 1).bit_length()
    if path == "allgather":
        return 2 * L * a + (N - min(counts)) * r * beta + N * row_bytes * g
    if path == "sharded":
        if groups > 1 and q > 1:
            n = N / p
            inside = (q - 1) * (a + n * r * params.beta_intra) + q * n * row_bytes * g
            inside += (q - 1).bit_length() * (a + union * r * params.beta_intra)
            leaders = CostParams(a, params.beta_inter, params.beta_inter, params.gamma)
            return inside + predict_sparse("sharded", [min(union, q * n)] * groups, union, row_bytes, num_rows, 1,
                                           leaders)
        to_owners = 2 * L * a + 2 * (p - 1) * a + max(max(counts), N / p) * (p - 1) / p * r * beta
        return to_owners + union * (p - 1) / p * r * beta + N / p * row_bytes * g
    raise KeyError(f"no cost formula for sparse aggregation {path!r}")


def choose_sparse(counts, union, row_bytes, num_rows, q, params, candidates=SPARSE_PATHS):
    """The sparse path with the lowest predicted time (the first one on ties)."""
    return min(candidates, key=lambda path: predict_sparse(path, counts, union, row_bytes, num_rows, q, params))


def _pair_time(comm, order, nbytes, reps):
    """Max over ranks of the mean time of one Sendrecv with the partner at logical distance 1 in ``order``."""
    me = order.index(comm.rank)
    partner = order[me ^ 1] if (me ^ 1) < len(order) else None
    send, recv = numpy.zeros(nbytes, numpy.uint8), numpy.empty(nbytes, numpy.uint8)
    comm.comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(reps if partner is not None else 0):
        comm.comm.Sendrecv(send, partner, 99, recv, partner, 99)
    dt = numpy.array([(time.perf_counter() - t0) / reps])
    comm.comm.Allreduce(MPI.IN_PLACE, dt, op=MPI.MAX)
    return float(dt[0])


def calibrate(comm, nbytes=1 << 22, reps=(50, 4)):
    """Measure alpha, beta_intra, beta_inter and gamma with a short collective benchmark (~0.1-1 s)."""
    x = numpy.ones(nbytes // 4, numpy.float32)
    t0 = time.perf_counter()
    for _ in range(reps[1]):
        numpy.add(x, x, out=x)
    gamma = (time.perf_counter() - t0) / reps[1] / nbytes
    if comm.size == 1:
        return CostParams(1e-6, 2 * gamma, 2 * gamma, gamma)
    intra, inter = ring_order(comm.group_of), round_robin_order(comm.group_of)
    alpha = _pair_time(comm, intra, 8, reps[0])
    beta_intra = max(_pair_time(comm, intra, nbytes, reps[1]) - alpha, 0.0) / nbytes
    beta_inter = beta_intra
    if comm.num_groups > 1:
        beta_inter = max(_pair_time(comm, inter, nbytes, reps[1]) - alpha, 0.0) / nbytes
    return CostParams(alpha, beta_intra, beta_inter, gamma)


def cache_path():
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "layerforge",
                                                     "comm_calibration.json")


def cache_key(comm):
    version = MPI.Get_library_version().splitlines()[0].strip()
    return f"{MPI.Get_processor_name()}|p={comm.size}|groups={comm.num_groups}x{comm.group_size}|{version}"


def load_or_calibrate(comm, path=None):
    """Rank 0's cached parameters for this job shape, or a fresh calibration written to the cache.

    Rank 0 decides and broadcasts (buffer-based), so every rank models with the same numbers and ``auto``
    picks the same algorithm everywhere.
    """
    path = path or cache_path()
    key = cache_key(comm)
    found = numpy.zeros(5)
    if comm.rank == 0:
        try:
            with open(path) as f:
                p = CostParams.from_dict(json.load(f)[key])
            found[:] = (1.0, p.alpha, p.beta_intra, p.beta_inter, p.gamma)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    comm.comm.Bcast(found, root=0)
    if found[0]:
        return CostParams(*map(float, found[1:]))
    params = calibrate(comm)
    values = numpy.array([params.alpha, params.beta_intra, params.beta_inter, params.gamma])
    comm.comm.Bcast(values, root=0)  # rank 0's measurement is the one everybody uses
    params = CostParams(*map(float, values))
    if comm.rank == 0:
        _store(path, key, params)
    return params


def _store(path, key, params):
    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, ValueError):
        table = {}
    table[key] = params.to_dict()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs a recalibration next time
