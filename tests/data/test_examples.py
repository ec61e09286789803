"""Caffe's own examples, converted from their prototxt (configs/examples/), train on the data
``layerforge make_example_data`` makes, from the directory Caffe's examples run from."""
import os
import pathlib

import h5py
import numpy
import pytest

from layerforge import cli
from layerforge.data.examples import classification_points, siamese_pairs
from layerforge.data.lmdb_io import lmdb_exists
from layerforge.solvers import get_solver

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "configs" / "examples"


@pytest.fixture(scope="module")
def caffe_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("caffe_root")
    assert cli.main(["make_example_data", "all", "--root", str(root)]) == 0
    return root


def test_example_data_is_where_the_prototxt_files_look(caffe_root):
    for name in ("mnist/mnist_train_lmdb", "mnist/mnist_test_lmdb", "siamese/mnist_siamese_train_leveldb",
                 "siamese/mnist_siamese_test_leveldb"):
        assert lmdb_exists(caffe_root / "examples" / name)
    listing = (caffe_root / "examples/hdf5_classification/data/train.txt").read_text().split()
    assert listing == ["examples/hdf5_classification/data/train.h5"]
    with h5py.File(caffe_root / listing[0]) as f:
        assert f["data"].shape == (7500, 4) and f["label"].shape == (7500, 1)


def test_siamese_pairs_are_stacked_digits_with_similarity():
    images = numpy.arange(5 * 28 * 28, dtype=numpy.uint8).reshape(5, 1, 28, 28) % 251
    labels = numpy.array([0, 1, 0, 2, 1])
    pairs, similar = siamese_pairs(images, labels, seed=0)
    rs = numpy.random.RandomState(0)
    a, b = rs.randint(5, size=5), rs.randint(5, size=5)
    numpy.testing.assert_array_equal(pairs[:, 0], images[a, 0])
    numpy.testing.assert_array_equal(pairs[:, 1], images[b, 0])
    numpy.testing.assert_array_equal(similar, labels[a] == labels[b])


def test_classification_points_are_separable_but_not_linearly():
    x, y = classification_points(2000)
    assert x.shape == (2000, 4) and set(numpy.unique(y)) == {0.0, 1.0}
    # each class is two opposite clusters: least squares on the features (a linear model) does poorly
    features = numpy.hstack([x, numpy.ones((len(x), 1))])
    w = numpy.linalg.lstsq(features, y * 2 - 1, rcond=None)[0]
    assert ((features @ w > 0) == (y > 0.5)).mean() < 0.8


def train(caffe_root, monkeypatch, solver, iterations, **overrides):
    monkeypatch.chdir(caffe_root)
    s = get_solver(str(EXAMPLES / solver), max_iter=iterations, solver_mode="CPU", snapshot=0,
                   snapshot_after_train=False, test_initialization=False, **overrides)
    losses = []
    s.add_callback(lambda it, loss: losses.append(loss))
    s.step(iterations)
    return s, losses


def test_mnist_autoencoder_with_its_nesterov_solver(caffe_root, monkeypatch):
    s, losses = train(caffe_root, monkeypatch, "mnist_autoencoder_solver_nesterov.yaml", 60)
    assert type(s).__name__ == "NesterovSolver" and s.param.momentum == 0.95
    # the cross-entropy over the 784 pixels falls from about 544 (sigmoid outputs near 0.5)
    assert losses[0] > 500 and numpy.mean(losses[-10:]) < 0.5 * losses[0]
    assert len(s.test_nets) == 2  # test-on-train and test-on-test stages


def test_mnist_siamese_shares_weights_and_learns(caffe_root, monkeypatch):
    s, losses = train(caffe_root, monkeypatch, "mnist_siamese_solver.yaml", 60)
    net = s.net
    assert net.params["conv1"][0] is net.params["conv1_p"][0]  # the two towers share weights by param name
    assert net.num_learnable == sum(b.count for name in ("conv1", "conv2", "ip1", "ip2", "feat")
                                    for b in net.params[name])
    assert numpy.mean(losses[-10:]) < numpy.mean(losses[:10])


def test_hdf5_classification(caffe_root, monkeypatch):
    s, _ = train(caffe_root, monkeypatch, "hdf5_classification_solver.yaml", 1000)
    scores = s.test_nets[0].forward()
    accuracy = numpy.mean([s.test_nets[0].forward()["accuracy"] for _ in range(50)])
    assert "accuracy" in scores and accuracy > 0.85


def test_examples_need_their_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from layerforge.errors import LayerforgeError

    with pytest.raises(LayerforgeError, match="examples/mnist/mnist_train_lmdb"):
        get_solver(str(EXAMPLES / "mnist_autoencoder_solver_nesterov.yaml"), solver_mode="CPU")
    assert not os.path.exists(tmp_path / "examples")


def test_cifar10_full_sigmoid_bn_reads_its_mean_binaryproto(caffe_root, monkeypatch):
    from layerforge.caffe.blobproto import read_blobproto

    mean = read_blobproto(caffe_root / "examples/cifar10/mean.binaryproto")
    assert mean.shape == (1, 3, 32, 32) and 0 < mean.mean() < 255
    s, losses = train(caffe_root, monkeypatch, "cifar10_full_sigmoid_solver_bn.yaml", 3)
    assert [layer.type for layer in s.net.layers].count("BatchNorm") == 3
    data = s.test_nets[0].blobs["data"].data
    assert data.shape == (1000, 3, 32, 32)
    assert abs(float(data.mean())) < 10  # the mean image was subtracted
    assert all(numpy.isfinite(losses))
