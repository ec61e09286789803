"""Caffe's Datum records (layerforge/data/datum.py) and LMDB databases of them read by the Data layer."""
import copy

import cv2
import lmdb
import numpy
import pytest
import yaml

from layerforge import Net, rng
from layerforge.caffe.caffe_pb import Datum
from layerforge.data.datum import array_to_datum, datum_to_array, decode_datum, encoded_datum
from layerforge.data import mnist
from layerforge.data.lmdb_io import LMDBReader, LMDBWriter
from layerforge.errors import DataError
from layerforge.solvers import get_solver


def write_caffe_db(path, datums):
    """An LMDB as Caffe's convert_imageset writes it: keys '%08d_<file name>', values serialized Datums."""
    env = lmdb.open(str(path), map_size=64 << 20)
    with env.begin(write=True) as txn:
        for i, datum in enumerate(datums):
            txn.put(b"%08d_img%d.png" % (i, i), datum.SerializeToString())
    env.close()
    return str(path)


def test_raw_and_float_datums():
    x = numpy.arange(24, dtype=numpy.uint8).reshape(2, 3, 4)
    datum = array_to_datum(x, 7)
    assert (datum.channels, datum.height, datum.width, datum.label) == (2, 3, 4, 7)
    assert datum.data == x.tobytes() and not datum.float_data and not datum.encoded
    array, label = datum_to_array(Datum.FromString(datum.SerializeToString()))
    assert label == 7 and array.dtype == numpy.uint8
    numpy.testing.assert_array_equal(array, x)
    f = numpy.linspace(-1, 1, 6).reshape(1, 2, 3)
    datum = array_to_datum(f, 2)
    assert not datum.data and len(datum.float_data) == 6
    array, label = datum_to_array(datum)
    assert array.dtype == numpy.float32 and label == 2
    numpy.testing.assert_array_equal(array, f.astype(numpy.float32))


@pytest.mark.parametrize("ext, channels, exact", [(".png", 3, True), (".png", 1, True), (".jpg", 3, False)])
def test_encoded_datums_decode_with_their_own_channels(ext, channels, exact):
    g = numpy.random.default_rng(0)
    image = numpy.clip(g.normal(128, 20, (6, 5, 3)), 0, 255).astype(numpy.uint8)
    image = image[:, :, 0] if channels == 1 else image
    ok, data = cv2.imencode(ext, image)
    assert ok
    datum = encoded_datum(data.tobytes(), 3)
    array, label = decode_datum(datum.SerializeToString())
    assert label == 3 and array.shape == (channels, 6, 5) and array.dtype == numpy.uint8
    expected = image[None] if channels == 1 else image.transpose(2, 0, 1)  # BGR planes, as Caffe
    if exact:
        numpy.testing.assert_array_equal(array, expected)
    else:
        assert numpy.abs(array.astype(int) - expected).mean() < 12


@pytest.mark.parametrize("datum, message", [
    (Datum(channels=1, height=2, width=2, data=b"abc"), "3 bytes of data do not fill the Datum's shape 1x2x2"),
    (Datum(channels=1, height=2, width=2, float_data=[1.0]), "1 float_data values do not fill the Datum's shape 1x2x2"),
    (Datum(data=b"not an image", encoded=True), "the encoded image (12 bytes) cannot be decoded"),
    (Datum(channels=0, height=0, width=0), "the Datum's shape 0x0x0 holds no values"),
    (Datum(channels=3, height=0, width=2, float_data=[]), "the Datum's shape 3x0x2 holds no values"),
])
def test_bad_records_name_the_key(tmp_path, datum, message):
    good = array_to_datum(numpy.zeros((1, 2, 2), numpy.uint8), 0)
    source = write_caffe_db(tmp_path / "db", [good, datum])
    reader = LMDBReader(source)
    assert reader.format == "Datum"
    with pytest.raises(DataError) as e:
        reader.read(1)
    assert str(e.value) == f"{source}: key '00000001_img1.png': {message}"


def test_garbage_record_names_the_key(tmp_path):
    source = write_caffe_db(tmp_path / "db", [array_to_datum(numpy.zeros((1, 2, 2), numpy.uint8), 0)])
    env = lmdb.open(source)
    with env.begin(write=True) as txn:
        txn.put(b"00000001_bad", b"\xff\xff\xff")
    env.close()
    with pytest.raises(DataError, match=r"key '00000001_bad': corrupted Datum record"):
        LMDBReader(source).read(1)


def test_shape_change_names_the_key(tmp_path):
    source = write_caffe_db(tmp_path / "db", [array_to_datum(numpy.zeros((1, 2, 2), numpy.uint8), 0),
                                              array_to_datum(numpy.zeros((1, 3, 2), numpy.uint8), 1)])
    net = Net({"name": "d", "layers": [{"name": "d", "type": "Data", "top": ["data", "label"],
                                        "data": {"source": source, "batch_size": 2, "prefetch": 0}}]}, phase="test")
    with pytest.raises(DataError, match=r"key '00000001_img1.png': shape \(1, 3, 2\) differs"):
        net.forward()


# ------------------------------------------------------------------------------------------
# a Datum database in LeNet

N = 256


@pytest.fixture(scope="module")
def mnist_dbs(tmp_path_factory):
    """The first N training digits as a Caffe Datum LMDB (written with the protobuf classes) and as LFR1."""
    root = tmp_path_factory.mktemp("dbs")
    records = LMDBReader(mnist.prepare()[0]).read_many(range(N))
    datum_db = write_caffe_db(root / "datum_lmdb", [
        Datum(channels=1, height=28, width=28, data=a.tobytes(), label=int(label)) for a, label in records])
    with LMDBWriter(root / "lfr1_lmdb") as w:
        for a, label in records:
            w.add(a, label)
    return datum_db, str(root / "lfr1_lmdb")


def lenet(source):
    with open("configs/lenet.yaml") as f:
        net = yaml.safe_load(f)
    for layer in net["layers"]:
        if layer["type"] == "Data":
            layer["data"]["source"] = source
            layer["data"]["batch_size"] = 16
    return net


def test_datum_db_gives_the_batches_of_the_lfr1_db(mnist_dbs):
    datum_db, lfr1_db = mnist_dbs
    batches = []
    for source in (datum_db, lfr1_db):
        rng.seed(5)
        net = Net(copy.deepcopy(lenet(source)), phase="train")
        assert LMDBReader(source).format == ("Datum" if source == datum_db else "LFR1")
        batches.append([])
        for _ in range(20):  # more than an epoch: the shuffled orders must agree too
            net.forward(end="mnist")
            batches[-1].append((net.blobs["data"].data.copy(), net.blobs["label"].data.copy()))
    for (x, y), (x2, y2) in zip(*batches):
        numpy.testing.assert_array_equal(x, x2)
        numpy.testing.assert_array_equal(y, y2)
    assert batches[0][0][0].max() == pytest.approx(255 / 256)  # scaled by 1/256, as the config says


def test_lenet_trains_on_a_datum_db(mnist_dbs):
    datum_db, _ = mnist_dbs
    solver = get_solver({"net_param": lenet(datum_db), "type": "Adam", "base_lr": 0.002, "momentum": 0.9,
                         "max_iter": 30, "random_seed": 1})
    losses = []
    solver.add_callback(lambda it, loss: losses.append(loss))
    solver.step(30)
    assert numpy.isfinite(losses).all()
    assert numpy.mean(losses[-5:]) < 0.6 * numpy.mean(losses[:5])
