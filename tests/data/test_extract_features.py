"""``layerforge extract_features``: Caffe's tool, its arguments in its order, its databases read back."""
import os
import subprocess
import sys

import lmdb
import numpy
import pytest

from layerforge.caffe.caffe_pb import Datum
from layerforge.data.lmdb_io import LMDBWriter
from layerforge.net import Net

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NET = """name: "features"
layer {{ name: "data" type: "Data" top: "data" top: "label"
        transform_param {{ scale: 0.00390625 }} data_param {{ source: "{db}" batch_size: 4 backend: LMDB }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param {{ num_output: 3 kernel_size: 3
        weight_filler {{ type: "xavier" }} bias_filler {{ type: "constant" value: 0.1 }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param {{ num_output: 5
        weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "prob" type: "Softmax" bottom: "ip" top: "prob" }}
"""


@pytest.fixture
def model(tmp_path):
    """(net file, weights file): a small classifier over an LMDB of 10 records, and weights saved from it."""
    g = numpy.random.default_rng(0)
    with LMDBWriter(str(tmp_path / "db")) as w:
        for i in range(10):
            w.add(g.integers(0, 256, (1, 6, 6)).astype(numpy.uint8), i % 3)
    net_path = tmp_path / "net.prototxt"
    net_path.write_text(NET.format(db=tmp_path / "db"))
    Net(str(net_path), phase="test").save(str(tmp_path / "w.npz"))
    return str(net_path), str(tmp_path / "w.npz")


def extract(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "layerforge", "extract_features", *map(str, argv)],
                          capture_output=True, text=True, cwd=REPO, env=dict(os.environ, **(env or {})))


def read_back(path):
    """[(key, Datum)] of a database, in key order."""
    with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin() as txn:
        return [(key.decode(), Datum.FromString(value)) for key, value in txn.cursor()]


def reference(net_path, weights, blob, batches):
    net = Net(net_path, phase="test", weights=weights)
    out = []
    for _ in range(batches):
        net.forward()
        out.append(numpy.asarray(net.blobs[blob].data).copy())
    net.layers[0].close()
    return numpy.concatenate(out)


@pytest.mark.parametrize("mode", [[], ["GPU", 0]])
def test_features_of_two_blobs_as_caffes_tool_writes_them(tmp_path, model, mode):
    net_path, weights = model
    done = extract(weights, net_path, "conv,prob", f"{tmp_path / 'conv_db'},{tmp_path / 'prob_db'}", 3, "lmdb", *mode)
    assert done.returncode == 0, done.stderr
    assert "Extracted features of 12 query images for feature blob prob" in done.stderr
    for blob, db, shape in (("conv", "conv_db", (3, 4, 4)), ("prob", "prob_db", (5, 1, 1))):
        records = read_back(tmp_path / db)
        assert [key for key, _ in records] == [f"{i:010d}" for i in range(12)]  # 3 batches of 4: record 0 again
        assert all((d.channels, d.height, d.width) == shape and not d.data and not d.HasField("label")
                   for _, d in records)
        got = numpy.array([d.float_data for _, d in records], numpy.float32)
        want = reference(net_path, weights, blob, 3).reshape(12, -1)
        numpy.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    numpy.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)
    # a Data layer reads the features back, as a Caffe user's next net (an SVM, a small classifier) does
    reader = Net({"name": "r", "layers": [{"name": "d", "type": "Data", "top": ["f", "l"],
                                           "data": {"source": str(tmp_path / "prob_db"), "batch_size": 12,
                                                    "shuffle": False}}]}, phase="test")
    numpy.testing.assert_allclose(numpy.asarray(reader.forward()["f"]).reshape(12, 5), got, rtol=1e-7)
    reader.layers[0].close()


@pytest.mark.parametrize("args, message", [
    (("ip,prob", "{t}/a", 1, "lmdb"), "2 blob names (ip,prob) and 1 database names ({t}/a): give one database per blob"),
    (("fc7", "{t}/a", 1, "lmdb"), "the net has no blob 'fc7' (its blobs: data, label, conv, ip, prob)"),
    (("ip", "{t}/db", 1, "lmdb"), "{t}/db: exists already; extract_features writes new databases only"),
    (("ip", "{t}/a", 1, "hdf5"), "db_type 'hdf5': give lmdb"),
    (("ip", "{t}/a", 0, "lmdb"), "batches 0: give at least 1 mini-batch"),
])
def test_bad_arguments_are_one_line_and_write_nothing(tmp_path, model, args, message):
    net_path, weights = model
    args = [str(a).format(t=tmp_path) for a in args]
    done = extract(weights, net_path, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message.format(t=tmp_path) in last, done.stderr
    assert not (tmp_path / "a").exists()


def test_the_tools_script_runs_the_command(tmp_path, model):
    net_path, weights = model
    done = subprocess.run([sys.executable, os.path.join(REPO, "tools", "extract_features"), weights, net_path, "ip",
                           str(tmp_path / "ip_db"), "1", "leveldb"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert len(read_back(tmp_path / "ip_db")) == 4  # leveldb is written as LMDB
