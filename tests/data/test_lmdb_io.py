import os

import cv2
import lmdb
import numpy
import pytest

from layerforge.data.lmdb_io import (HEADER, LMDBReader, LMDBWriter, decode_record, encode_image_record,
                                     encode_record, record_key, write_lmdb_atomic)
from layerforge.errors import DataError


@pytest.mark.parametrize("dtype", [numpy.uint8, numpy.float32])
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 5, 7)])
def test_round_trip(tmp_path, dtype, shape):
    rs = numpy.random.RandomState(0)
    arrays = [(rs.rand(*shape) * 255).astype(dtype) for _ in range(5)]
    with LMDBWriter(tmp_path / "db", commit_every=2) as w:
        for i, a in enumerate(arrays):
            w.add(a, label=i * 3 - 1)
    reader = LMDBReader(tmp_path / "db")
    assert len(reader) == 5
    assert reader.keys == [b"00000000", b"00000001", b"00000002", b"00000003", b"00000004"]
    for i, a in enumerate(arrays):
        got, label = reader.read(i)
        assert got.dtype == dtype and label == i * 3 - 1
        numpy.testing.assert_array_equal(got, a)


def test_header_layout():
    value = encode_record(numpy.arange(6, dtype=numpy.uint8).reshape(1, 2, 3), 7)
    assert HEADER.size == 24 and len(value) == 24 + 6
    assert value[:4] == b"LFR1" and value[4] == 0
    assert value[8:24] == (1).to_bytes(4, "little") + (2).to_bytes(4, "little") + (3).to_bytes(4, "little") \
        + (7).to_bytes(4, "little")
    assert value[24:] == bytes(range(6))


@pytest.mark.parametrize("ext", [".png", ".jpg"])
def test_encoded_record(ext):
    image = numpy.random.RandomState(1).randint(0, 256, (6, 8, 3)).astype(numpy.uint8)
    ok, data = cv2.imencode(ext, image)
    got, label = decode_record(encode_image_record(data.tobytes(), (3, 6, 8), 4))
    assert got.shape == (3, 6, 8) and label == 4
    if ext == ".png":  # lossless
        numpy.testing.assert_array_equal(got, image.transpose(2, 0, 1))


def test_map_grows(tmp_path):
    with LMDBWriter(tmp_path / "db", map_size=1 << 16) as w:
        for i in range(40):
            w.add(numpy.full((1, 64, 64), i, numpy.uint8), i)
    reader = LMDBReader(tmp_path / "db")
    assert len(reader) == 40 and reader.read(39)[0][0, 0, 0] == 39


def test_atomic_write_refuses_existing(tmp_path):
    records = [encode_record(numpy.zeros((1, 2, 2), numpy.uint8), 0)]
    assert write_lmdb_atomic(tmp_path / "db", records) == 1
    with pytest.raises(DataError, match="already exists"):
        write_lmdb_atomic(tmp_path / "db", records)
    assert write_lmdb_atomic(tmp_path / "db", records, exist_ok=True) == 1
    assert sorted(os.listdir(tmp_path)) == ["db"]  # no temporary directory left behind


def test_missing_database(tmp_path):
    with pytest.raises(DataError) as e:
        LMDBReader(tmp_path / "nowhere")
    assert str(e.value) == f"{tmp_path / 'nowhere'}: no LMDB database there (no data.mdb)"


@pytest.mark.parametrize("garbage, why", [
    (b"garbage bytes here, not a record", "bad magic b'garb' (expected b'LFR1')"),
    (b"LFR1", "4 bytes is shorter than the 24-byte header"),
    (HEADER.pack(b"LFR1", 0, 1, 2, 2, 0) + b"abc", "payload of 3 bytes does not hold 1x2x2 uint8 values"),
    (HEADER.pack(b"LFR1", 2, 1, 2, 2, 0) + b"notapng", "the encoded image cannot be decoded"),
    (HEADER.pack(b"LFR1", 9, 1, 2, 2, 0), "unknown record kind 9"),
    (HEADER.pack(b"LFR1", 0, 0, 0, 0, 0), "its shape 0x0x0 holds no values"),
    (HEADER.pack(b"LFR1", 1, 3, 0, 2, 0), "its shape 3x0x2 holds no values"),
])
def test_corrupted_record(tmp_path, garbage, why):
    write_lmdb_atomic(tmp_path / "db", [encode_record(numpy.zeros((1, 2, 2), numpy.uint8), 0)] * 3)
    env = lmdb.open(str(tmp_path / "db"))
    with env.begin(write=True) as txn:
        txn.put(record_key(1), garbage)
    env.close()
    reader = LMDBReader(tmp_path / "db")
    reader.read(0)
    with pytest.raises(DataError) as e:
        reader.read(1)
    assert str(e.value) == f"{tmp_path / 'db'}: key '00000001': corrupted record: {why}"
