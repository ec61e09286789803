"""In-process checks (p = 1, COMM_SELF), schedules, cost model, launch guard and the bench command."""
import argparse
import json

import numpy
import pytest

MPI = pytest.importorskip("mpi4py.MPI")

from layerforge.comm import ALGORITHMS, Communicator, CostParams, get_algorithm, launch_guard  # noqa: E402
from layerforge.comm import cost_model, nccl  # noqa: E402
from layerforge.comm.buffers import block_starts  # noqa: E402
from layerforge.comm.recursive import mpich_schedule  # noqa: E402
from layerforge.comm.ring import ring_order  # noqa: E402
from layerforge.comm.topology import round_robin_order, topology_schedule  # noqa: E402
from layerforge.commands import bench_allreduce  # noqa: E402
from layerforge.errors import ConfigError  # noqa: E402

from .mpirun import run_mpi  # noqa: E402

PARAMS = CostParams(alpha=5e-6, beta_intra=1e-10, beta_inter=1e-9, gamma=1e-10)


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if n != "nccl"])
@pytest.mark.parametrize("dtype", [numpy.float16, numpy.float32, numpy.float64])
def test_comm_self_is_identity(name, dtype):
    comm = Communicator(MPI.COMM_SELF, cost_params=PARAMS)
    x = numpy.arange(12, dtype=dtype).reshape(3, 4)
    assert comm.allreduce(x, algorithm=name) is x
    numpy.testing.assert_array_equal(x, numpy.arange(12).reshape(3, 4))
    out = numpy.zeros_like(x)
    comm.allreduce(x, out, algorithm=name)
    numpy.testing.assert_array_equal(out, x)
    assert comm.bytes_sent == {"intra": 0, "inter": 0}


def test_bad_buffers_and_names():
    comm = Communicator(MPI.COMM_SELF)
    with pytest.raises(TypeError, match="float16/float32/float64"):
        comm.allreduce(numpy.arange(3), algorithm="ring")
    with pytest.raises(ValueError, match="contiguous"):
        comm.allreduce(numpy.zeros((4, 4), numpy.float32)[:, 1], algorithm="ring")
    with pytest.raises(KeyError, match="choose from recursive, topology"):
        get_algorithm("tree")


def test_block_starts_cover_any_length():
    assert block_starts(10, 4) == [0, 3, 6, 8, 10]
    assert block_starts(2, 4) == [0, 1, 2, 2, 2]
    assert block_starts(0, 2) == [0, 0, 0]


def test_round_robin_and_ring_orders():
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    assert round_robin_order(groups) == [0, 4, 1, 5, 2, 6, 3, 7]
    assert round_robin_order([0, 0, 1, 1, 2]) == [0, 2, 4, 1, 3]
    assert ring_order([1, 0, 1, 0]) == [1, 3, 0, 2]


def test_schedules_fold_like_mpich_and_inside_groups():
    assert mpich_schedule(range(6)) == (((0, 1), (2, 3)), (1, 3, 4, 5))
    folds, core = topology_schedule((0, 0, 0, 1, 1, 1))
    assert all(a // 3 == b // 3 for a, b in folds)  # every fold stays in its group
    assert len(core) == 4 and [c // 3 for c in core] == [0, 1, 0, 1]
    assert topology_schedule((0, 0, 1, 1)) == ((), (0, 2, 1, 3))


def test_cost_formulas_by_hand():
    p = CostParams(alpha=1.0, beta_intra=0.01, beta_inter=0.1, gamma=0.001)
    n = 800
    # p = 8, q = 4: 2*3 alpha + 2n(3*bi + 4*bx)/8 + n*7/8*g
    assert cost_model.predict("recursive", n, 8, 4, p) == pytest.approx(6 + 200 * (0.03 + 0.4) + 0.7)
    assert cost_model.predict("topology", n, 8, 4, p) == pytest.approx(6 + 200 * (0.06 + 0.1) + 0.7)
    assert cost_model.predict("ring", n, 8, 4, p) == pytest.approx(14 + 1400 * 0.1 / 4 + 0.7)  # one stream per link
    assert cost_model.predict("doubling", n, 8, 4, p) == pytest.approx(3 + 800 * (0.02 + 0.1) + 2.4)
    # 2 tree steps inside each group of 4, then Rabenseifner over 2 leaders, each alone on its group's link
    inside = 2 * 2 * (1 + 800 * 0.01) + 2 * 800 * 0.001
    leaders = 2 * 1 + 2 * 800 * 0.1 / 4 / 2 + 800 / 2 * 0.001
    assert cost_model.predict("hierarchical", n, 8, 4, p) == pytest.approx(inside + leaders)
    # fold for p = 5: 2 alpha + 2n beta_intra + n gamma on top of the p = 4 core
    assert cost_model.predict("recursive", n, 5, 1, p) - cost_model.predict("recursive", n, 4, 1, p) == \
        pytest.approx(2 + 16 + 0.8)


def test_auto_picks_latency_then_bandwidth_algorithms():
    assert cost_model.choose(8, 64, 8, PARAMS) == "doubling"
    # 8 ranks per group share one link: ring's lone crossing stream beats topology's shared crossings
    assert cost_model.choose(1 << 26, 64, 8, PARAMS) == "ring"
    assert cost_model.choose(1 << 26, 8, 2, PARAMS) == "topology"
    assert cost_model.choose(1 << 26, 64, 64, PARAMS) == "topology"  # one group: ties go to the first


def test_calibration_is_cached(tmp_path, monkeypatch):
    path = tmp_path / "cal.json"
    comm = Communicator(MPI.COMM_SELF)
    first = cost_model.load_or_calibrate(comm, str(path))
    table = json.loads(path.read_text())
    assert list(table.values()) == [first.to_dict()]
    monkeypatch.setattr(cost_model, "calibrate", lambda *a, **k: pytest.fail("recalibrated"))
    assert cost_model.load_or_calibrate(comm, str(path)) == first


def test_nccl_imports_without_cupy_and_refuses(no_gpu):
    with pytest.raises(RuntimeError, match="cupy"):
        nccl.allreduce_nccl(Communicator(MPI.COMM_SELF), numpy.zeros(3, numpy.float32))


def test_launch_guard_reraises_on_one_rank():
    with pytest.raises(ValueError, match="boom"):
        with launch_guard(MPI.COMM_SELF):
            raise ValueError("boom")


def test_abort_ends_the_rank_even_when_mpi_abort_returns():
    """MPI_Abort returned on a rank whose peer was aborting the job too (two ranks refusing a solver file at once), and
    the guard went on to print the error a second time, with a traceback."""
    import subprocess
    import sys

    from tests.test_cli import ROOT

    code = ("from layerforge.comm import abort\n"
            "class Rank1:\n"
            "    def Get_rank(self): return 1\n"
            "    def Abort(self, code): pass  # returns, as MPI_Abort did\n"
            "abort('error: a bad key', 2, Rank1())\n"
            "print('went on')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", "rank 1: error: a bad key\n")


def test_parse_size():
    assert [bench_allreduce.parse_size(s) for s in ("1K", "1M", "100M", "512", "1.5K")] == \
        [1024, 1 << 20, 100 << 20, 512, 1536]
    with pytest.raises(ConfigError):
        bench_allreduce.parse_size("lots")


def _args(**kw):
    parser = argparse.ArgumentParser()
    bench_allreduce.add_arguments(parser)
    return parser.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()] + ["--json"])


def test_bench_in_process(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(cost_model.CACHE_ENV, str(tmp_path / "cal.json"))
    assert bench_allreduce.run(_args(sizes="1K,4K", iterations=2)) == 0
    doc = json.loads(capsys.readouterr().out)
    names = {r["algorithm"] for r in doc["results"]}
    assert doc["p"] == 1 and len(doc["results"]) == 2 * len(names) and "hierarchical" in names
    assert all(r["correct"] and r["busbw_GBps"] == 0.0 for r in doc["results"])
    with pytest.raises(ConfigError, match="unknown allreduce algorithm"):
        bench_allreduce.run(_args(algorithms="tree"))


@pytest.mark.mpi
def test_bench_under_mpiexec(tmp_path):
    code = ("import sys; from layerforge.commands.bench_allreduce import *; import argparse; "
            "p = argparse.ArgumentParser(); add_arguments(p); sys.exit(run(p.parse_args(sys.argv[1:])))")
    proc = run_mpi(4, ["-c", code, "--sizes", "4K,64K", "--iterations", "2", "--group-size", "2", "--json"],
                   env={cost_model.CACHE_ENV: str(tmp_path / "cal.json")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert (doc["p"], doc["groups"], doc["group_size"]) == (4, 2, 2)
    rows = {(r["bytes"], r["algorithm"]): r for r in doc["results"]}
    assert all(r["correct"] for r in rows.values())
    r = rows[(65536, "recursive")]
    assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 1.5)
    assert (r["intra_bytes"], r["inter_bytes"]) == (65536 / 2, 65536)  # eqs. 3-4 with p=4, q=2
    assert rows[(65536, "topology")]["inter_bytes"] == 65536 / 2      # eq. 6: factor q = 2 fewer
    assert rows[(65536, "mpi")]["intra_bytes"] is None
    assert (tmp_path / "cal.json").exists()  # auto calibrated and cached


@pytest.mark.parametrize("version, raw_id", [("14.2.0", bytes(range(128))), ("13.6.0", tuple(range(-64, 64)))])
def test_nccl_id_goes_to_the_communicator_in_the_form_cupy_takes(monkeypatch, version, raw_id):
    """cupy 14 returns the unique id as bytes and takes bytes; cupy 13 used tuples of signed chars."""
    import sys
    import types

    made = []
    fake_nccl = types.SimpleNamespace(get_unique_id=lambda: raw_id,
                                      NcclCommunicator=lambda n, uid, rank: made.append((n, uid, rank)) or "comm")
    fake_cuda = types.SimpleNamespace(nccl=fake_nccl)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__=version, cuda=fake_cuda,
                                                                   ndarray=type("ndarray", (), {})))
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake_cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", fake_nccl)
    comm = Communicator(MPI.COMM_SELF)
    assert nccl._nccl_comm(comm) == "comm"
    (n, uid, rank), = made
    assert (n, rank) == (1, 0) and type(uid) is type(raw_id)
    assert nccl.unique_id_bytes(uid) == nccl.unique_id_bytes(raw_id) and len(nccl.unique_id_bytes(uid)) == 128


def test_nccl_allreduce_on_one_rank_on_the_device():
    import cupy
    comm = Communicator(MPI.COMM_SELF)
    x = cupy.arange(6, dtype=cupy.float32)
    assert nccl.allreduce_nccl(comm, x) is x and x.tolist() == list(range(6))
    host = numpy.arange(4, dtype=numpy.float64)
    assert nccl.allreduce_nccl(comm, host) is host and host.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("in_place", [True, False])
def test_nccl_allreduce_on_the_device_returns_once_every_rank_has_given_its_part(in_place):
    """As every algorithm of the table, the NCCL one returns with the collective done, not only queued:
    bench_allreduce times the call, and a Communicator's deadline watches this rank's wait inside it. Two ranks
    on two devices of this process, one thread each: rank 1 gives its part only once rank 0 has returned, or after
    two seconds; rank 0 must not have returned by then."""
    import threading
    import types

    import cupy
    from cupy.cuda import nccl as cuda_nccl

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two devices")
    comms = cuda_nccl.NcclCommunicator.initAll([0, 1])
    calling, returned, early, results = threading.Event(), threading.Event(), [], [None, None]

    def rank(r):
        with cupy.cuda.Device(r):
            x = cupy.arange(6, dtype=cupy.float32) * (r + 1)
            out = x if in_place else cupy.zeros_like(x)
            if r == 0:
                calling.set()
            else:
                calling.wait()
                early.append(returned.wait(2.0))
            nccl.allreduce_nccl(types.SimpleNamespace(_nccl=comms[r]), x, None if in_place else out)
            returned.set()
            results[r] = out.get()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert early == [False]
    for got in results:
        numpy.testing.assert_array_equal(got, numpy.arange(6) * 3)
