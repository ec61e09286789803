"""`mpiexec -n P layerforge train`: P ranks x batch b == 1 rank x batch P*b, failures end the job."""
import re
import subprocess
import sys
import time

import numpy
import pytest
import yaml

from layerforge.data.lmdb_io import LMDBWriter, encode_record, record_key
from tests.comm.mpirun import ROOT, run_mpi
from tests.devices import needs_two_gpus

pytestmark = pytest.mark.mpi

TOTAL_BATCH = 12   # P * b for P = 2, 3, 4
RECORDS = 96       # 3 iterations x iter_size 2 x 12 = 72 records: no epoch wraps


def write_db(path, corrupt_index=None):
    g = numpy.random.default_rng(0)
    with LMDBWriter(str(path)) as w:
        for i in range(RECORDS):
            label = int(i % 3)
            x = g.standard_normal((2, 3, 3)).astype(numpy.float32) + label
            w.put(encode_record(x, label))
    if corrupt_index is not None:
        import lmdb
        env = lmdb.open(str(path), subdir=True)
        with env.begin(write=True) as txn:
            txn.put(record_key(corrupt_index), b"garbage")
        env.close()


def write_configs(tmp_path, batch, db, test_db):
    net = {"name": "dp", "layers": [
        {"name": "data", "type": "Data", "top": ["data", "label"], "include": {"phase": "TRAIN"},
         "data": {"source": str(db), "batch_size": batch, "shuffle": False}},
        {"name": "data", "type": "Data", "top": ["data", "label"], "include": {"phase": "TEST"},
         "data": {"source": str(test_db), "batch_size": batch, "shuffle": False}},
        {"name": "ip1", "type": "InnerProduct", "bottom": "data", "top": "ip1",
         "inner_product": {"num_output": 8, "weight_filler": {"type": "gaussian", "std": 0.3},
                           "bias_filler": {"type": "constant", "value": 0.1}}},
        {"name": "relu1", "type": "ReLU", "bottom": "ip1", "top": "ip1"},
        {"name": "ip2", "type": "InnerProduct", "bottom": "ip1", "top": "ip2",
         "inner_product": {"num_output": 3, "weight_filler": {"type": "gaussian", "std": 0.3}}},
        {"name": "accuracy", "type": "Accuracy", "bottom": ["ip2", "label"], "top": "accuracy",
         "include": {"phase": "TEST"}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip2", "label"], "top": "loss"},
    ]}
    (tmp_path / f"net{batch}.yaml").write_text(yaml.safe_dump(net))
    solver = {"net": f"net{batch}.yaml", "type": "SGD", "base_lr": 0.5, "momentum": 0.9, "weight_decay": 0.01,
              "iter_size": 2, "clip_gradients": 0.5, "lr_policy": "step", "gamma": 0.5, "stepsize": 2,
              "max_iter": 3, "display": 1, "test_iter": [2], "test_interval": 3, "test_initialization": False,
              "snapshot_prefix": str(tmp_path / f"out{batch}" / "dp"), "random_seed": 7, "dtype": "float64"}
    path = tmp_path / f"solver{batch}.yaml"
    path.write_text(yaml.safe_dump(solver))
    return path


def final_weights(tmp_path, batch):
    with numpy.load(tmp_path / f"out{batch}" / "dp_iter_3.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    write_db(tmp / "train_db")
    write_db(tmp / "test_db")
    solver = write_configs(tmp, TOTAL_BATCH, tmp / "train_db", tmp / "test_db")
    proc = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", str(solver)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return tmp, final_weights(tmp, TOTAL_BATCH), proc.stderr


def scores_in(log):
    return re.findall(r"Test net output #\d+: (\w+) = ([-\d.e+]+)", log)


@pytest.mark.parametrize("p,algorithm", [(2, "recursive"), (3, "topology"), (4, "ring"), (3, "hierarchical")])
def test_p_ranks_equal_one_rank_with_total_batch(reference, p, algorithm):
    tmp, expected, reference_log = reference
    solver = write_configs(tmp, TOTAL_BATCH // p, tmp / "train_db", tmp / "test_db")
    proc = run_mpi(p, ["-m", "layerforge", "train", "--solver", str(solver), "--allreduce", algorithm], timeout=180)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    got = final_weights(tmp, TOTAL_BATCH // p)
    assert sorted(got) == sorted(expected)
    for key in expected:
        numpy.testing.assert_allclose(got[key], expected[key], rtol=1e-9, atol=1e-12, err_msg=key)
    # rank 0 alone logs, and test scores are reduced over the ranks' test shards
    assert proc.stderr.count("Optimization Done.") == 1
    assert scores_in(proc.stderr) == scores_in(reference_log) != []
    assert f"Data parallel over {p} ranks" in proc.stderr


@needs_two_gpus
def test_two_ranks_on_gpus_with_nccl_equal_one_rank_with_total_batch(reference):
    """``--gpu 0`` under mpiexec: rank r trains on GPU r (the emulated devices where there is none) and the
    gradients are summed by NCCL, overlapped with backward, on the device."""
    tmp, expected, reference_log = reference
    solver = write_configs(tmp, TOTAL_BATCH // 2, tmp / "train_db", tmp / "test_db")
    proc = run_mpi(2, ["-m", "layerforge", "train", "--solver", str(solver), "--gpu", "0", "--allreduce", "nccl"],
                   timeout=180)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    got = final_weights(tmp, TOTAL_BATCH // 2)
    for key in expected:
        numpy.testing.assert_allclose(got[key], expected[key], rtol=1e-9, atol=1e-12, err_msg=key)
    assert "Data parallel over 2 ranks" in proc.stderr and "allreduce nccl" in proc.stderr
    assert scores_in(proc.stderr) == scores_in(reference_log) != []


def test_bad_record_on_one_rank_ends_the_job(tmp_path):
    write_db(tmp_path / "train_db", corrupt_index=5)  # record 5 belongs to rank 1's shard (5 % 2 == 1)
    write_db(tmp_path / "test_db")
    solver = write_configs(tmp_path, 6, tmp_path / "train_db", tmp_path / "test_db")
    start = time.monotonic()
    proc = run_mpi(2, ["-m", "layerforge", "train", "--solver", str(solver)], timeout=60)
    assert time.monotonic() - start < 30
    assert proc.returncode != 0
    assert re.search(r"rank 1: error: .*key '?0*5'?", proc.stderr), proc.stderr


def test_ranks_with_different_configs_refuse_to_start(tmp_path):
    script = ("from mpi4py import MPI\n"
              "from layerforge.comm import Communicator, launch_guard\n"
              "from layerforge.dataparallel.rank_agreement import check_same\n"
              "with launch_guard():\n"
              "    comm = Communicator()\n"
              "    check_same(comm, bytes([comm.rank == 2] * 32), 'configuration')\n")
    proc = run_mpi(3, ["-c", script], timeout=60)
    assert proc.returncode != 0
    assert "rank 2 has a different configuration than rank 0" in proc.stderr
