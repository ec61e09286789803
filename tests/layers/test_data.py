import os

import cv2
import lmdb
import numpy
import pytest

import layerforge.layers.data  # noqa: F401  (registers Data and ImageData)
from layerforge import rng
from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.data.lmdb_io import LMDBWriter, record_key
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer


def write_db(path, n=10, shape=(1, 4, 4)):
    """Record i: every pixel i, label i % 10 (so a batch tells which records it holds)."""
    with LMDBWriter(path) as w:
        for i in range(n):
            w.add(numpy.full(shape, i, numpy.uint8), i % 10)
    return str(path)


def data_layer(source, phase="TRAIN", xp=numpy, transform=None, **data):
    data = dict({"source": source, "batch_size": 4, "prefetch": 0}, **data)
    layer = create_layer({"name": "d", "type": "Data", "top": ["data", "label"], "data": data,
                          "transform": transform or {}}, phase=phase, dtype=numpy.float64, xp=xp)
    top = [Blob(xp=xp), Blob(xp=xp)]
    layer.setup([], top)
    return layer, top


def take(layer, top, batches):
    out = []
    for _ in range(batches):
        layer.forward([], top)
        out.append((to_numpy(top[0].data).copy(), to_numpy(top[1].data).copy()))
    return out


def ids(batches):
    return [int(v) for data, _ in batches for v in data[:, 0, 0, 0]]


def test_sequential_read_wraps_around(tmp_path, xp):
    layer, top = data_layer(write_db(tmp_path / "db"), phase="TEST", xp=xp)
    assert top[0].shape == (4, 1, 4, 4) and top[1].shape == (4,)
    batches = take(layer, top, 3)
    assert ids(batches) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    numpy.testing.assert_array_equal(batches[2][1], [8, 9, 0, 1])
    numpy.testing.assert_array_equal(batches[0][0][1], numpy.full((1, 4, 4), 1.0))
    assert layer.has_backward is False and layer.get_state()["position"] == 12


def test_transform_applied(tmp_path):
    layer, top = data_layer(write_db(tmp_path / "db", shape=(1, 6, 6)), phase="TEST",
                            transform={"scale": 0.5, "crop_size": 4, "mean_value": 1})
    assert top[0].shape == (4, 1, 4, 4)
    numpy.testing.assert_array_equal(take(layer, top, 1)[0][0][:, 0, 0, 0], [-0.5, 0.0, 0.5, 1.0])


def test_shuffle_every_epoch_and_reproducible(tmp_path):
    source = write_db(tmp_path / "db", n=12)
    rng.seed(7)
    a = ids(take(*data_layer(source), 9))  # 3 epochs of 12 records
    epochs = [a[0:12], a[12:24], a[24:36]]
    assert all(sorted(e) == list(range(12)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] and epochs[0] != list(range(12))
    rng.seed(7)
    assert ids(take(*data_layer(source), 9)) == a
    rng.seed(8)
    assert ids(take(*data_layer(source), 9)) != a
    rng.seed(7)  # TEST does not shuffle unless asked
    assert ids(take(*data_layer(source, phase="TEST"), 3)) == list(range(12))
    assert sorted(ids(take(*data_layer(source, phase="TEST", shuffle=True), 3))) == list(range(12))


@pytest.mark.parametrize("n, world_size", [(10, 3), (12, 4), (7, 2)])
def test_shards_are_disjoint_and_cover(tmp_path, n, world_size):
    source = write_db(tmp_path / "db", n=n)
    shards = []
    for rank in range(world_size):
        layer, top = data_layer(source, rank=rank, world_size=world_size, batch_size=1)
        shard_size = len(range(rank, n, world_size))
        shards.append(ids(take(layer, top, shard_size)))
        assert sorted(shards[-1]) == list(range(rank, n, world_size))
    assert sorted(sum(shards, [])) == list(range(n))


def test_prefetch_gives_the_same_batches(tmp_path):
    source = write_db(tmp_path / "db", n=11, shape=(1, 6, 6))
    transform = {"crop_size": 4, "mirror": True}
    got = []
    for prefetch in (0, 1, 4):
        rng.seed(3)
        layer, top = data_layer(source, transform=transform, prefetch=prefetch, batch_size=3)
        got.append(take(layer, top, 8))
        layer.close()
    for other in got[1:]:
        for (d0, l0), (d1, l1) in zip(got[0], other):
            numpy.testing.assert_array_equal(d0, d1)
            numpy.testing.assert_array_equal(l0, l1)


@pytest.mark.parametrize("prefetch", [0, 3])
def test_state_restore_gives_identical_batches(tmp_path, prefetch, xp):
    source = write_db(tmp_path / "db", n=10, shape=(1, 6, 6))
    transform = {"crop_size": 3, "mirror": True}
    rng.seed(1)
    # on cupy the layer stages the next batch on the device ahead of time: the state still names the next one
    layer, top = data_layer(source, transform=transform, prefetch=prefetch, batch_size=3, xp=xp)
    take(layer, top, 5)
    state = layer.get_state()
    expected = take(layer, top, 6)
    rng.seed(99)  # a different seed: the state alone must decide what follows
    resumed, rtop = data_layer(source, transform=transform, prefetch=prefetch, batch_size=3, xp=xp)
    take(resumed, rtop, 2)
    resumed.set_state(state)
    for (d0, l0), (d1, l1) in zip(expected, take(resumed, rtop, 6)):
        numpy.testing.assert_array_equal(d0, d1)
        numpy.testing.assert_array_equal(l0, l1)
    layer.close(), resumed.close()


def test_the_device_finish_gives_the_hosts_tops(tmp_path):
    """On a device the uint8 crops cross on DeviceFeed's stream and the mean file and scale are applied there:
    the tops are the host's, batch after batch (the same random crops and mirrors from one seed)."""
    import cupy

    g = numpy.random.default_rng(5)
    with LMDBWriter(tmp_path / "db") as w:
        for i in range(12):
            w.add(g.integers(0, 256, (3, 6, 7), dtype=numpy.uint8), i % 10)
    numpy.save(tmp_path / "mean.npy", g.uniform(0, 255, (3, 6, 7)).astype(numpy.float32))
    transform = {"crop_size": 4, "mirror": True, "mean_file": str(tmp_path / "mean.npy"), "scale": 0.25}
    batches = []
    for module in (numpy, cupy):
        rng.seed(3)
        layer, top = data_layer(str(tmp_path / "db"), transform=transform, xp=module, prefetch=2)
        batches.append(take(layer, top, 4))
        layer.close()
    for (host, host_labels), (device, device_labels) in zip(*batches):
        numpy.testing.assert_allclose(device, host, rtol=1e-6, atol=1e-6)
        numpy.testing.assert_array_equal(device_labels, host_labels)
    assert len({batch.tobytes() for batch, _ in batches[0]}) == 4  # and they were different batches


def test_state_is_json_able(tmp_path):
    import json
    layer, top = data_layer(write_db(tmp_path / "db"))
    take(layer, top, 2)
    state = json.loads(json.dumps(layer.get_state()))
    assert state["position"] == 8 and state["type"] == "Data"


def test_rand_skip(tmp_path):
    source = write_db(tmp_path / "db", n=10)
    starts = {data_layer(source, phase="TEST", rand_skip=5)[0].get_state()["position"] for _ in range(30)}
    assert starts <= set(range(5)) and len(starts) > 1


def test_missing_database(tmp_path):
    with pytest.raises(DataError) as e:
        data_layer(str(tmp_path / "absent_lmdb"))
    assert str(e.value) == (f"layer 'd' (Data): data.source '{tmp_path / 'absent_lmdb'}': "
                            f"{tmp_path / 'absent_lmdb'}: no LMDB database there (no data.mdb)")


@pytest.mark.parametrize("prefetch", [0, 2])
def test_corrupted_record(tmp_path, prefetch, xp):
    source = write_db(tmp_path / "db", n=10)
    env = lmdb.open(source)
    with env.begin(write=True) as txn:
        txn.put(record_key(6), b"garbage bytes written over record 6")
    env.close()
    layer, top = data_layer(source, phase="TEST", prefetch=prefetch, xp=xp)
    take(layer, top, 1)  # on cupy this reads batch 2 ahead: its error comes with the forward that needs it
    with pytest.raises(DataError) as e:
        take(layer, top, 1)
    assert str(e.value) == f"{source}: key '00000006': corrupted record: bad magic b'garb' (expected b'LFR1')"
    layer.close()


def test_record_of_another_shape(tmp_path):
    source = write_db(tmp_path / "db", n=4)
    env = lmdb.open(source)
    from layerforge.data.lmdb_io import encode_record
    with env.begin(write=True) as txn:
        txn.put(record_key(2), encode_record(numpy.zeros((1, 5, 5), numpy.uint8), 0))
    env.close()
    layer, top = data_layer(source, phase="TEST")
    with pytest.raises(DataError, match=r"key '00000002': shape \(1, 5, 5\) differs from the first record's "
                                        r"\(1, 4, 4\)"):
        take(layer, top, 1)


def test_config_errors():
    with pytest.raises(ConfigError, match="key 'data.batch_size': required key is missing"):
        create_layer({"type": "Data", "top": ["data"], "data": {"source": "x"}})
    with pytest.raises(ConfigError, match="rank 2 must be less than world_size 2"):
        create_layer({"type": "Data", "top": ["data"], "data": {"source": "x", "batch_size": 1, "rank": 2,
                                                                 "world_size": 2}})
    with pytest.raises(ConfigError, match="key 'data.backend': expected one of LMDB, got 'leveldb'"):
        create_layer({"type": "Data", "top": ["data"], "data": {"source": "x", "batch_size": 1,
                                                                 "backend": "leveldb"}})


def test_shipped_mnist_source_is_created_on_first_use(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERFORGE_DATA_DIR", str(tmp_path / "generated"))
    monkeypatch.chdir(tmp_path)
    # a checkout may already hold data/mnist: make the repository root one without it
    monkeypatch.setattr("layerforge.data.repo_root", lambda: str(tmp_path / "elsewhere"))
    layer, top = data_layer("data/mnist/mnist_test_lmdb", phase="TEST", batch_size=100,
                            transform={"scale": 0.00390625})
    assert top[0].shape == (100, 1, 28, 28)
    data, labels = take(layer, top, 1)[0]
    assert 0.0 <= data.min() and data.max() <= 1.0 and set(labels.tolist()) <= set(range(10))
    assert os.path.isdir(tmp_path / "generated" / "mnist" / "mnist_train_lmdb")


# -- ImageData ------------------------------------------------------------------------------------

def write_images(tmp_path, sizes):
    lines = []
    for i, (h, w) in enumerate(sizes):
        image = numpy.zeros((h, w, 3), numpy.uint8)
        image[..., 0], image[..., 1], image[..., 2] = i, 100 + i, 200 + i  # B, G, R
        cv2.imwrite(str(tmp_path / f"img {i}.png"), image)
        lines.append(f"img {i}.png {i % 3}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return str(tmp_path / "list.txt")


def image_layer(tmp_path, **block):
    block = dict({"source": str(tmp_path / "list.txt"), "root_folder": str(tmp_path), "batch_size": 2,
                  "prefetch": 0}, **block)
    layer = create_layer({"name": "img", "type": "ImageData", "top": ["data", "label"], "image_data": block},
                         phase="TEST", dtype=numpy.float32)
    top = [Blob(), Blob()]
    layer.setup([], top)
    return layer, top


def test_image_data_reads_bgr_images_and_labels(tmp_path):
    write_images(tmp_path, [(5, 7)] * 3)
    layer, top = image_layer(tmp_path)
    assert top[0].shape == (2, 3, 5, 7)
    (d0, l0), (d1, l1) = take(layer, top, 2)
    numpy.testing.assert_array_equal(d0[1, :, 0, 0], [1, 101, 201])
    numpy.testing.assert_array_equal(l0, [0, 1])
    numpy.testing.assert_array_equal(l1, [2, 0])  # wraps around to the first image
    assert d0.dtype == numpy.float32


def test_image_data_resize_and_gray(tmp_path):
    write_images(tmp_path, [(5, 7), (9, 4), (6, 6)])
    layer, top = image_layer(tmp_path, new_height=8, new_width=3, is_color=False, batch_size=3)
    assert top[0].shape == (3, 1, 8, 3)
    data, _ = take(layer, top, 1)[0]
    # grey = 0.299 R + 0.587 G + 0.114 B of a flat image, for image 2: B 2, G 102, R 202
    assert abs(data[2, 0, 4, 1] - (0.299 * 202 + 0.587 * 102 + 0.114 * 2)) <= 1


def test_image_data_sizes_must_agree_without_resize(tmp_path):
    write_images(tmp_path, [(5, 7), (9, 4)])
    layer, top = image_layer(tmp_path)
    with pytest.raises(DataError, match=r"list.txt:2: image '.*img 1.png': shape \(3, 9, 4\) differs"):
        take(layer, top, 1)


@pytest.mark.parametrize("workers", [1, 3])
def test_unreadable_image(tmp_path, workers):
    write_images(tmp_path, [(4, 4)] * 3)
    (tmp_path / "img 1.png").write_bytes(b"not a png")
    layer, top = image_layer(tmp_path, prefetch=2, decode_workers=workers)
    with pytest.raises(DataError) as e:
        take(layer, top, 1)
    assert str(e.value) == (f"{tmp_path / 'list.txt'}:2: image '{tmp_path / 'img 1.png'}': "
                            "cannot read the image (missing, or not an image)")
    layer.close()


def test_bad_list_file(tmp_path):
    (tmp_path / "list.txt").write_text("a.png 0\nb.png x\n")
    with pytest.raises(DataError, match=r"list.txt:2: expected 'path label' with an integer label, got 'b.png x'"):
        image_layer(tmp_path)
    with pytest.raises(DataError, match="absent.txt: cannot read the image list"):
        image_layer(tmp_path, source=str(tmp_path / "absent.txt"))
    with pytest.raises(ConfigError, match="give both new_height and new_width"):
        image_layer(tmp_path, new_height=3)
