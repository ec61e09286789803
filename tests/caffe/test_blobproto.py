"""Caffe's .binaryproto mean files: written by compute_image_mean, read by transform.mean_file (caffe/blobproto.py)."""
import argparse
import struct

import numpy
import pytest

from layerforge import Net
from layerforge.caffe import caffe_pb
from layerforge.caffe.blobproto import read_blobproto, write_blobproto
from layerforge.commands import compute_image_mean
from layerforge.data.lmdb_io import LMDBWriter
from layerforge.data.transform import load_mean
from layerforge.errors import LayerforgeError


def make_db(path, images):
    with LMDBWriter(path) as w:
        for i, image in enumerate(images):
            w.add(image, i)


def test_compute_image_mean_writes_caffes_binaryproto(tmp_path):
    images = [numpy.full((2, 3, 4), v, numpy.uint8) for v in (1, 2, 6)]
    images[0][1, 2, 3] = 10
    make_db(tmp_path / "db", images)
    parser = argparse.ArgumentParser()
    compute_image_mean.add_arguments(parser)
    assert compute_image_mean.run(parser.parse_args([str(tmp_path / "db"), str(tmp_path / "mean.binaryproto")])) == 0
    raw = (tmp_path / "mean.binaryproto").read_bytes()
    expected = numpy.full((2, 3, 4), 3, numpy.float32)
    expected[1, 2, 3] = 6
    # num 1, channels 2, height 3, width 4 (legacy fields 1-4, as Caffe's tool), then 24 packed floats (field 5)
    assert raw == b"\x08\x01\x10\x02\x18\x03\x20\x04\x2a\x60" + struct.pack("<24f", *expected.ravel())
    blob = caffe_pb.BlobProto.FromString(raw)
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 2, 3, 4) and not blob.HasField("shape")
    numpy.testing.assert_array_equal(load_mean(str(tmp_path / "mean.binaryproto")), expected)


@pytest.mark.parametrize("legacy", [True, False])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_round_trip_is_bit_identical(tmp_path, legacy, dtype):
    array = numpy.random.default_rng(3).standard_normal((1, 3, 2, 5)).astype(dtype)
    write_blobproto(tmp_path / "a.binaryproto", array, legacy=legacy)
    back = read_blobproto(tmp_path / "a.binaryproto")
    assert back.dtype == dtype and back.tobytes() == array.tobytes()
    write_blobproto(tmp_path / "b.binaryproto", back, legacy=legacy)
    assert (tmp_path / "a.binaryproto").read_bytes() == (tmp_path / "b.binaryproto").read_bytes()


def test_data_layer_subtracts_a_binaryproto_mean(tmp_path):
    images = [numpy.arange(24, dtype=numpy.uint8).reshape(2, 3, 4) * (i + 1) for i in range(2)]
    make_db(tmp_path / "db", images)
    mean = numpy.random.default_rng(0).uniform(0, 5, (1, 2, 3, 4)).astype(numpy.float32)
    write_blobproto(tmp_path / "mean.binaryproto", mean)
    net = Net({"name": "m", "layers": [
        {"name": "d", "type": "Data", "top": ["data", "label"],
         "transform": {"mean_file": str(tmp_path / "mean.binaryproto"), "scale": 0.5},
         "data": {"source": str(tmp_path / "db"), "batch_size": 2, "prefetch": 0}}]}, phase="test")
    net.forward()
    numpy.testing.assert_allclose(net.blobs["data"].data, (numpy.stack(images) - mean) * 0.5, rtol=1e-6)


@pytest.mark.parametrize("content", [b"\x0a\x05\x08", b"\xff\xff\xff\xff", b""])
def test_bad_files_are_one_line_naming_the_path(tmp_path, content):
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(content)
    with pytest.raises(LayerforgeError) as e:
        load_mean(str(path))
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)
