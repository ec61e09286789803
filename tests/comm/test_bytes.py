"""Bytes each rank sends, intra- and inter-group, equal the closed forms (swCaffe eqs. 3-6)."""
import json

import pytest

from layerforge.comm.topology import (plain_inter_bytes, plain_intra_bytes, topology_inter_bytes,
                                      topology_intra_bytes)

from .mpirun import WORKER, run_mpi

N = 8192 * 8  # bytes, divisible by every p below


def counts(p, q, n=N):
    proc = run_mpi(p, [WORKER, "bytes", str(n), str(q)], timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {d["algorithm"]: d for d in (json.loads(line) for line in proc.stdout.splitlines() if line.strip())}


def test_formulas_by_hand():
    # p = 8 ranks in groups of q = 4, n = 800 bytes: plain crosses at distances 4 (400 B) twice -> 800,
    # in-group at 2 and 1 (200 + 100) twice -> 600; round robin crosses only at distance 1 (100 B) twice
    assert (plain_intra_bytes(800, 8, 4), plain_inter_bytes(800, 8, 4)) == (600, 800)
    assert (topology_intra_bytes(800, 8, 4), topology_inter_bytes(800, 8, 4)) == (1200, 200)


@pytest.mark.mpi
@pytest.mark.parametrize("p,q", [(4, 2), (8, 2), (8, 4), (2, 1), (4, 4)])
def test_power_of_two_counts_equal_formulas(p, q):
    c = counts(p, q)
    assert c["recursive"]["intra"] == [plain_intra_bytes(N, p, q)] * p
    assert c["recursive"]["inter"] == [plain_inter_bytes(N, p, q)] * p
    assert c["topology"]["intra"] == [topology_intra_bytes(N, p, q)] * p
    assert c["topology"]["inter"] == [topology_inter_bytes(N, p, q)] * p
    if 1 < q < p:  # the predicted reduction factor (p - q) / (p/q - 1) = q, exactly
        assert sum(c["recursive"]["inter"]) == q * sum(c["topology"]["inter"])
    # ring: 2 (p-1)/p n per rank; with groups in ring order only the p/q boundary ranks send across
    assert [a + b for a, b in zip(c["ring"]["intra"], c["ring"]["inter"])] == [2 * (p - 1) * N // p] * p
    assert sum(x > 0 for x in c["ring"]["inter"]) == (p // q if q < p else 0)
    # recursive doubling: the whole vector log2(p) times
    assert [a + b for a, b in zip(c["doubling"]["intra"], c["doubling"]["inter"])] == [N * (p.bit_length() - 1)] * p


@pytest.mark.mpi
@pytest.mark.parametrize("p,q", [(3, 1), (5, 2), (6, 3)])
def test_non_power_of_two_totals(p, q):
    c = counts(p, q)
    pof2 = 1 << (p.bit_length() - 1)
    r = p - pof2
    # r folds in and out (n bytes each) + pof2 ranks each sending 2 (pof2-1)/pof2 n
    total = 2 * r * N + 2 * (pof2 - 1) * N
    for alg in ("recursive", "topology"):
        assert sum(c[alg]["intra"]) + sum(c[alg]["inter"]) == total
    assert sum(c["topology"]["inter"]) <= sum(c["recursive"]["inter"])
    if q > 1:  # folds pair ranks inside a group
        assert sum(c["topology"]["inter"]) < sum(c["recursive"]["inter"])


@pytest.mark.mpi
@pytest.mark.parametrize("p,q", [(8, 2), (8, 4), (4, 2)])
def test_hierarchical_counts(p, q):
    c = counts(p, q)["hierarchical"]
    groups = p // q
    leaders = [r for r in range(p) if r % q == 0]
    # only the leaders cross groups, each sending Rabenseifner's 2 n (G-1)/G among the G leaders
    assert c["inter"] == [2 * N * (groups - 1) // groups if r in leaders else 0 for r in range(p)]
    # in-group binomial trees: every rank but the leader sends n once up; the broadcast sends n once per
    # receiving member, from the member that holds it (the leader sends log2 q times)
    assert sum(c["intra"]) == 2 * (q - 1) * N * groups
    assert sum(c["inter"]) < sum(counts(p, q)["recursive"]["inter"])
