"""Overlapped gradient exchange and ChainerMN's double buffering under `mpiexec -n P layerforge train`.

Overlap sends each bucket as soon as backward has finished its parameters; it must give the bits of the
exchange after backward. Double buffering updates with the previous iteration's averaged gradients; it must
equal one process with the total batch that applies each gradient one iteration late."""
import sys

import numpy
import pytest
import yaml

from layerforge.solvers import get_solver
from layerforge.solvers.seam import Seam
from tests.comm.mpirun import ROOT, run_mpi
from tests.devices import needs_two_gpus

pytestmark = pytest.mark.mpi

TOTAL_BATCH = 12
RECORDS = 96


def write_db(path):
    from layerforge.data.lmdb_io import LMDBWriter, encode_record
    g = numpy.random.default_rng(0)
    with LMDBWriter(str(path)) as w:
        for i in range(RECORDS):
            label = int(i % 3)
            w.put(encode_record(g.standard_normal((2, 5, 5)).astype(numpy.float32) + label, label))


def write_solver(tmp_path, tag, batch, max_iter=3, batch_norm=True, **keys):
    """A conv net (with a fused BatchNorm + Scale + ReLU chain unless ``batch_norm`` is False: its batch
    statistics make P x b differ from 1 x P*b) and its SGD solver with tiny buckets (several per layer)."""
    net = {"name": "overlap", "layers": [
        {"name": "data", "type": "Data", "top": ["data", "label"],
         "data": {"source": str(tmp_path / "train_db"), "batch_size": batch, "shuffle": False}},
        {"name": "conv", "type": "Convolution", "bottom": "data", "top": "conv",
         "convolution": {"num_output": 4, "kernel_size": 3, "engine": "IM2COL",  # AUTO times: runs may differ
                         "weight_filler": {"type": "gaussian", "std": 0.3}}},
        {"name": "bn", "type": "BatchNorm", "bottom": "conv", "top": "conv"},
        {"name": "scale", "type": "Scale", "bottom": "conv", "top": "conv", "scale": {"bias_term": True}},
        {"name": "relu", "type": "ReLU", "bottom": "conv", "top": "conv"},
        {"name": "ip1", "type": "InnerProduct", "bottom": "conv", "top": "ip1",
         "inner_product": {"num_output": 8, "weight_filler": {"type": "gaussian", "std": 0.3}}},
        {"name": "ip2", "type": "InnerProduct", "bottom": "ip1", "top": "ip2",
         "inner_product": {"num_output": 3, "weight_filler": {"type": "gaussian", "std": 0.3}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip2", "label"], "top": "loss"},
    ]}
    if not batch_norm:
        net["layers"] = [layer for layer in net["layers"] if layer["type"] not in ("BatchNorm", "Scale")]
    (tmp_path / f"net_{tag}.yaml").write_text(yaml.safe_dump(net))
    solver = {"net": f"net_{tag}.yaml", "type": "SGD", "base_lr": 0.3, "momentum": 0.9, "weight_decay": 0.01,
              "iter_size": 2, "max_iter": max_iter, "display": 1, "allreduce_bucket_mb": 0.0005,
              "snapshot_prefix": str(tmp_path / f"out_{tag}" / "s"), "random_seed": 7, "dtype": "float64", **keys}
    path = tmp_path / f"solver_{tag}.yaml"
    path.write_text(yaml.safe_dump(solver))
    return path


def weights(tmp_path, tag, it=3):
    with numpy.load(tmp_path / f"out_{tag}" / f"s_iter_{it}.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("overlap")
    write_db(tmp / "train_db")
    return tmp


def train(tmp, p, tag, batch_norm=True, gpu=False, **keys):
    """``mpiexec -n p layerforge train`` (``--gpu 0`` when ``gpu``: a device per rank, the emulated ones where there
    is none); rank 0's final weights and the log."""
    solver = write_solver(tmp, tag, TOTAL_BATCH // p, batch_norm=batch_norm, **keys)
    on_device = ["--gpu", "0"] if gpu else []
    proc = run_mpi(p, ["-m", "layerforge", "train", "--solver", str(solver), *on_device], timeout=180)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return weights(tmp, tag), proc.stderr


@pytest.mark.parametrize("p,algorithm,gpu", [(2, "recursive", False), (3, "ring", False), (2, "mpi", False),
                                             (3, "hierarchical", False),
                                             pytest.param(2, "nccl", True, marks=needs_two_gpus)])
def test_overlapped_exchange_gives_the_same_bits(db, p, algorithm, gpu):
    after, log_after = train(db, p, f"after_{p}_{algorithm}", gpu=gpu, allreduce=algorithm.upper(),
                             allreduce_overlap=False)
    over, log_over = train(db, p, f"over_{p}_{algorithm}", gpu=gpu, allreduce=algorithm.upper(),
                           allreduce_overlap=True)
    assert "overlapped with backward" in log_over and "after backward" in log_after
    assert "comm exposed" in log_over
    assert sorted(over) == sorted(after)
    for key in after:
        assert over[key].tobytes() == after[key].tobytes(), key


def one_process_with_delayed_gradients(tmp, tag):
    """The reference: one process, the total batch, each iteration's gradient applied one iteration later."""
    solver = get_solver(str(write_solver(tmp, tag, TOTAL_BATCH, batch_norm=False)))
    stale = []

    class Delay(Seam):
        def before_update(self):
            fresh = [p.diff.copy() for p in solver.net.learnable_params]
            update = bool(stale)  # the first iteration has no gradient to apply yet
            if update:
                for p, g in zip(solver.net.learnable_params, stale.pop()):
                    p.diff[...] = g
            stale.append(fresh)
            return update
    solver.add_seam(Delay())
    solver.solve()
    return weights(tmp, tag)


@pytest.mark.parametrize("p,algorithm", [(2, "recursive"), (3, "mpi")])
def test_double_buffering_applies_each_gradient_one_iteration_late(db, p, algorithm):
    expected = one_process_with_delayed_gradients(db, f"delayed_{p}_{algorithm}")
    got, log = train(db, p, f"double_{p}_{algorithm}", False, allreduce=algorithm.upper(), double_buffering=True)
    assert "double buffering" in log
    for key in expected:
        numpy.testing.assert_allclose(got[key], expected[key], rtol=1e-9, atol=1e-12, err_msg=key)
    # and it is a different optimiser: the plain exchange ends elsewhere
    plain, _ = train(db, p, f"plain_{p}_{algorithm}", False, allreduce=algorithm.upper())
    assert not numpy.allclose(plain["ip2/0"], got["ip2/0"])


def test_time_reports_exposed_communication_both_ways(db):
    import json
    solver = yaml.safe_load(write_solver(db, "time", 6).read_text())
    net = db / solver["net"]
    proc = run_mpi(2, ["-m", "layerforge", "time", "--model", str(net), "--iterations", "3", "--json",
                       "--allreduce", "recursive", "--bucket-mb", "0.0005"], timeout=180)
    assert proc.returncode == 0, proc.stderr
    dp = json.loads(proc.stdout)["data_parallel"]  # rank 0 alone prints
    assert dp["ranks"] == 2 and dp["allreduce"] == "recursive"
    for mode in ("after", "overlapped"):
        f = dp[mode]
        assert 0 < f["comm_ms"] and 0 <= f["exposed_ms"] <= f["iteration_ms"]
    # after backward, every millisecond of communication is waited for
    assert dp["after"]["exposed_ms"] == pytest.approx(dp["after"]["comm_ms"], rel=0.2, abs=0.2)
