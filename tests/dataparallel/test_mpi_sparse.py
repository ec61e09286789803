"""`mpiexec -n P layerforge train` with an Embed: P ranks x batch b == 1 rank x batch P*b on every sparse path."""
import subprocess
import sys

import numpy
import pytest
import yaml

from layerforge.data.lmdb_io import LMDBWriter, encode_record
from tests.comm.mpirun import ROOT, run_mpi

pytestmark = pytest.mark.mpi

TOTAL_BATCH = 12   # P * b for P = 2, 3, 4
RECORDS = 96       # 3 iterations x iter_size 2 x 12 = 72 records: no epoch wraps
VOCAB, TOKENS = 40, 5


def write_db(path):
    # Zipf-like token ids: a few rows in most records, the tail rarely (some never), repeats within a record
    g = numpy.random.default_rng(0)
    with LMDBWriter(str(path)) as w:
        for i in range(RECORDS):
            tokens = numpy.minimum(g.zipf(1.3, TOKENS) - 1, VOCAB - 1).astype(numpy.float32)
            w.put(encode_record(tokens.reshape(TOKENS, 1, 1), int(tokens[0]) % 3))


def write_configs(tmp_path, batch, db, tag, **solver_keys):
    net = {"name": "sparse_dp", "layers": [
        {"name": "data", "type": "Data", "top": ["data", "label"],
         "data": {"source": str(db), "batch_size": batch, "shuffle": False}},
        {"name": "flat", "type": "Flatten", "bottom": "data", "top": "tokens"},
        {"name": "embed", "type": "Embed", "bottom": "tokens", "top": "embed",
         "embed": {"num_output": 6, "input_dim": VOCAB, "weight_filler": {"type": "gaussian", "std": 0.3}}},
        {"name": "ip", "type": "InnerProduct", "bottom": "embed", "top": "ip",
         "inner_product": {"num_output": 3, "weight_filler": {"type": "gaussian", "std": 0.3}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"},
    ]}
    (tmp_path / f"net{tag}.yaml").write_text(yaml.safe_dump(net))
    solver = {"net": f"net{tag}.yaml", "type": "SGD", "base_lr": 0.5, "momentum": 0.9, "weight_decay": 0.01,
              "iter_size": 2, "clip_gradients": 0.5, "max_iter": 3, "display": 1,
              "snapshot_prefix": str(tmp_path / f"out{tag}" / "dp"), "random_seed": 7, "dtype": "float64",
              **solver_keys}
    path = tmp_path / f"solver{tag}.yaml"
    path.write_text(yaml.safe_dump(solver))
    return path


def final_weights(tmp_path, tag):
    with numpy.load(tmp_path / f"out{tag}" / "dp_iter_3.npz") as f:
        return {k: f[k] for k in f.files if not k.startswith("history/")}, \
            {k: f[k] for k in f.files if k.startswith("history/")}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sparse_dp")
    write_db(tmp / "train_db")
    return tmp


def one_rank(tmp, **keys):
    tag = "ref_" + "_".join(f"{k}{v}" for k, v in sorted(keys.items()))
    solver = write_configs(tmp, TOTAL_BATCH, tmp / "train_db", tag, **keys)
    proc = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", str(solver)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return final_weights(tmp, tag)


CASES = [(2, "dense", {}), (2, "allgather", {}), (3, "sharded", {}), (4, "sharded", {}), (4, "auto", {}),
         (4, "sharded", {"group_size": 2}), (3, "allgather", {"type": "Adam", "sparse_update": "lazy"}),
         (4, "sharded", {"type": "Adam", "sparse_update": "lazy", "group_size": 2}),
         (3, "auto", {"type": "AdaGrad", "momentum": 0.0})]
IDS = [f"{p}-{path}-{'-'.join(map(str, k.values()))}" for p, path, k in CASES]


@pytest.mark.parametrize("p,path,keys", CASES, ids=IDS)
def test_p_ranks_equal_one_rank_on_every_sparse_path(db, p, path, keys):
    expected, expected_history = one_rank(db, **{k: v for k, v in keys.items() if k != "group_size"})
    tag = f"{p}_{path}_" + "_".join(f"{k}{v}" for k, v in sorted(keys.items()))
    solver = write_configs(db, TOTAL_BATCH // p, db / "train_db", tag, sparse_aggregation=path, **keys)
    proc = run_mpi(p, ["-m", "layerforge", "train", "--solver", str(solver)], timeout=180)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    got, history = final_weights(db, tag)
    assert sorted(got) == sorted(expected)
    for key in expected:
        numpy.testing.assert_allclose(got[key], expected[key], rtol=1e-9, atol=1e-12, err_msg=key)
    for key in expected_history:
        numpy.testing.assert_allclose(history[key], expected_history[key], rtol=1e-9, atol=1e-12, err_msg=key)
    if path == "auto":
        assert "Sparse aggregation of layer 'embed' parameter 0" in proc.stderr, proc.stderr


def test_lazy_one_rank_leaves_unused_rows(db):
    # the reference of the lazy cases does what lazy promises: rows no record uses keep their initial values
    tag = "lazy_rows"
    solver = write_configs(db, TOTAL_BATCH, db / "train_db", tag, type="Adam", sparse_update="lazy", max_iter=0)
    proc = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", str(solver)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before = numpy.load(db / f"out{tag}" / "dp_iter_0.npz")
    after, _ = one_rank(db, type="Adam", sparse_update="lazy")
    key = next(k for k in after if "embed" in k and k.endswith("0"))
    used = set()
    g = numpy.random.default_rng(0)
    for _ in range(72):
        used.update(numpy.minimum(g.zipf(1.3, TOKENS) - 1, VOCAB - 1).tolist())
    unused = sorted(set(range(VOCAB)) - used)
    assert unused, "the token draw should leave some rows unused"
    numpy.testing.assert_array_equal(after[key][unused], before[key][unused])
    assert not numpy.allclose(after[key][sorted(used)], before[key][sorted(used)])
