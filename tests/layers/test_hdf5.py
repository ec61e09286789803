import h5py
import numpy
import pytest

from layerforge.blob import Blob
from layerforge.errors import DataError, LayerforgeError
from layerforge.layers import create_layer
from layerforge.testing import make_blob


def write_h5(path, **datasets):
    with h5py.File(path, "w") as f:
        for name, array in datasets.items():
            f.create_dataset(name, data=array)
    return path


def two_files(tmp_path):
    """Files a.h5 (rows 0..3) and b.h5 (rows 4..9): data row r is r * ones(2, 3), label r."""
    rows = numpy.arange(10.0)
    data = rows[:, None, None] * numpy.ones((10, 2, 3))
    write_h5(tmp_path / "a.h5", data=data[:4], label=rows[:4])
    write_h5(tmp_path / "b.h5", data=data[4:], label=rows[4:])
    return rows


def make_data(xp, source, batch_size, tops=("data", "label"), **extra):
    layer = create_layer({"name": "h5", "type": "HDF5Data", "top": list(tops),
                          "hdf5_data": dict(source=str(source), batch_size=batch_size, **extra)},
                         dtype=numpy.float64, xp=xp)
    top = [Blob((), numpy.float64, xp) for _ in tops]
    layer.setup([], top)
    return layer, top


def labels_of(layer, top, batches):
    out = []
    for _ in range(batches):
        layer.forward([], top)
        out.append(numpy.asarray(top[1].data.get() if hasattr(top[1].data, "get") else top[1].data).copy())
    return numpy.concatenate(out)


@pytest.mark.parametrize("batch_size", [3, 4, 7])
def test_reads_files_in_order_and_wraps(xp, tmp_path, batch_size):
    rows = two_files(tmp_path)
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'a.h5'}\n\n{tmp_path / 'b.h5'}\n")
    layer, top = make_data(xp, tmp_path / "list.txt", batch_size)
    assert top[0].shape == (batch_size, 2, 3) and top[1].shape == (batch_size,)
    layer.forward([], top)
    data = numpy.asarray(top[0].data.get() if hasattr(top[0].data, "get") else top[0].data)
    numpy.testing.assert_array_equal(data, numpy.arange(batch_size)[:, None, None] * numpy.ones((1, 2, 3)))
    got = numpy.concatenate([numpy.arange(batch_size), labels_of(layer, top, 3)])
    numpy.testing.assert_array_equal(got, numpy.resize(rows, 4 * batch_size))


def test_a_dropped_layer_ends_its_pending_copy_before_its_blocks_are_reused(xp, tmp_path):
    """The layer stages the next batch on the device after each forward; dropped with that copy queued, its device
    buffers go back to the pool only once the copy has ended (else the copy lands in arrays made later)."""
    import gc

    two_files(tmp_path)
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'a.h5'}\n{tmp_path / 'b.h5'}\n")
    layer, top = make_data(xp, tmp_path / "list.txt", 4)
    layer.forward([], top)  # rows 0..3; rows 4..7 are queued for the next forward
    del layer, top
    gc.collect()
    reused = [xp.full((4, 2, 3), -1.0) for _ in range(4)] + [xp.full((4,), -1.0) for _ in range(4)]
    if xp is not numpy:
        xp.cuda.Device().synchronize()
    assert all((numpy.asarray(r.get() if hasattr(r, "get") else r) == -1).all() for r in reused)


def test_list_paths_resolve_against_the_list_folder_and_any_number_of_tops(tmp_path, monkeypatch):
    write_h5(tmp_path / "x.h5", a=numpy.arange(6.0).reshape(3, 2), b=numpy.arange(3.0) * 10, c=numpy.ones((3, 4, 1, 2)))
    (tmp_path / "list.txt").write_text("x.h5\n")
    monkeypatch.chdir("/")
    layer, top = make_data(numpy, tmp_path / "list.txt", 2, tops=("c", "a", "b"))
    assert [t.shape for t in top] == [(2, 4, 1, 2), (2, 2), (2,)]
    layer.forward([], top)
    numpy.testing.assert_array_equal(top[1].data, [[0, 1], [2, 3]])
    numpy.testing.assert_array_equal(top[2].data, [0, 10])
    layer.forward([], top)
    numpy.testing.assert_array_equal(top[2].data, [20, 0])


def test_shuffle_keeps_each_file_together_and_covers_every_row(tmp_path):
    two_files(tmp_path)
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'a.h5'}\n{tmp_path / 'b.h5'}\n")
    layer, top = make_data(numpy, tmp_path / "list.txt", 5, shuffle=True)
    epochs = labels_of(layer, top, 6).reshape(3, 10)
    for epoch in epochs:
        assert sorted(epoch) == list(range(10))
        first = set(epoch[:4]) if epoch[0] < 4 else set(epoch[:6])
        assert first in ({0, 1, 2, 3}, {4, 5, 6, 7, 8, 9})  # a file's rows are read together
    assert len({tuple(e) for e in epochs}) > 1  # a new order every epoch
    state = layer.get_state()
    following = labels_of(layer, top, 2)
    layer.set_state(state)
    numpy.testing.assert_array_equal(labels_of(layer, top, 2), following)


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_are_disjoint_and_cover_the_rows(tmp_path, world_size):
    two_files(tmp_path)
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'a.h5'}\n{tmp_path / 'b.h5'}\n")
    seen = []
    for rank in range(world_size):
        layer, top = make_data(numpy, tmp_path / "list.txt", 1, rank=rank, world_size=world_size)
        n = len(range(rank, 10, world_size))
        seen.append(labels_of(layer, top, n))
        numpy.testing.assert_array_equal(seen[-1], numpy.arange(rank, 10, world_size))
    assert sorted(numpy.concatenate(seen)) == list(range(10))


def test_bad_files_are_one_line_errors_naming_file_and_dataset(tmp_path):
    write_h5(tmp_path / "ok.h5", data=numpy.ones((4, 2)), label=numpy.ones(4))
    write_h5(tmp_path / "short.h5", data=numpy.ones((4, 2)), label=numpy.ones(3))
    write_h5(tmp_path / "nolabel.h5", data=numpy.ones((4, 2)))
    write_h5(tmp_path / "wide.h5", data=numpy.ones((4, 3)), label=numpy.ones(4))
    write_h5(tmp_path / "text.h5", data=numpy.ones((4, 2)), label=numpy.array([b"a", b"b", b"c", b"d"]))
    write_h5(tmp_path / "empty_rows.h5", data=numpy.ones((4, 0, 0, 0)), label=numpy.ones(4))
    (tmp_path / "junk.h5").write_text("not hdf5")
    cases = {"short.h5": "dataset 'label' has 3 rows but 'data' has 4", "nolabel.h5": "no dataset 'label'",
             "junk.h5": "cannot read the HDF5 file", "missing.h5": "cannot read the HDF5 file",
             "wide.h5": "dataset 'data' has rows of shape (3,)",
             "empty_rows.h5": "dataset 'data' has rows of shape (0, 0, 0), which hold no values",
             "text.h5": "dataset 'label' cannot be read as numbers"}
    for name, message in cases.items():
        (tmp_path / "list.txt").write_text(f"ok.h5\n{name}\n")
        with pytest.raises(DataError) as e:
            make_data(numpy, tmp_path / "list.txt", 2)
        text = str(e.value)
        assert message in text and name in text and "layer 'h5' (HDF5Data)" in text and "\n" not in text
    with pytest.raises(DataError, match="cannot read the HDF5 file list"):
        make_data(numpy, tmp_path / "nothere.txt", 2)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(DataError, match="names no files"):
        make_data(numpy, tmp_path / "empty.txt", 2)
    with pytest.raises(LayerforgeError, match="block 'transform' does not apply"):
        create_layer({"type": "HDF5Data", "top": ["data"], "hdf5_data": {"source": "x", "batch_size": 1},
                      "transform": {"scale": 2.0}})


def test_output_appends_batches_that_read_back(xp, tmp_path):
    out = tmp_path / "out.h5"
    layer = create_layer({"name": "out", "type": "HDF5Output", "bottom": ["data", "label"],
                          "hdf5_output": {"file_name": str(out)}}, dtype=numpy.float64, xp=xp)
    x = numpy.arange(24.0).reshape(4, 2, 3)
    y = numpy.arange(4.0).reshape(4, 1)
    bottom = [make_blob(x, xp=xp), make_blob(y, xp=xp)]
    layer.setup(bottom, [])
    layer.forward(bottom, [])
    bottom[0].data[...] += 100
    layer.forward(bottom, [])
    with h5py.File(out, "r") as f:
        assert f["data"].dtype == numpy.float32
        numpy.testing.assert_array_equal(f["data"][...], numpy.concatenate([x, x + 100]))
        numpy.testing.assert_array_equal(f["label"][...], numpy.concatenate([y, y]))
    # what HDF5Output writes, HDF5Data reads
    (tmp_path / "list.txt").write_text("out.h5\n")
    reader, top = make_data(numpy, tmp_path / "list.txt", 8)
    reader.forward([], top)
    numpy.testing.assert_array_equal(top[0].data, numpy.concatenate([x, x + 100]))


def test_output_refuses_bottoms_of_different_lengths(tmp_path):
    layer = create_layer({"type": "HDF5Output", "bottom": ["data", "label"],
                          "hdf5_output": {"file_name": str(tmp_path / "o.h5")}})
    with pytest.raises(LayerforgeError, match="same number of rows"):
        layer.setup([make_blob(numpy.ones((4, 2))), make_blob(numpy.ones(3))], [])


def test_caffe_prototxt_with_hdf5_layers_converts_and_runs(tmp_path, monkeypatch):
    from layerforge.net import Net
    monkeypatch.chdir(tmp_path)
    two_files(tmp_path)
    (tmp_path / "list.txt").write_text("a.h5\nb.h5\n")
    path = tmp_path / "net.prototxt"
    path.write_text("""name: "h5"
layers { name: "in" type: HDF5_DATA top: "data" top: "label"
         hdf5_data_param { source: "list.txt" batch_size: 5 } }
layers { name: "out" type: HDF5_OUTPUT bottom: "data" bottom: "label" hdf5_output_param { file_name: "o.h5" } }
""")
    net = Net(str(path), phase="test", dtype="float64")
    assert [layer.type for layer in net.layers] == ["HDF5Data", "HDF5Output"]
    net.forward()
    net.forward()
    with h5py.File(tmp_path / "o.h5", "r") as f:
        numpy.testing.assert_array_equal(f["label"][...], numpy.arange(10.0))


def test_converter_notes_a_missing_hdf5_source(tmp_path, monkeypatch):
    from layerforge.solvers.caffe_import import convert_file
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "net.prototxt"
    path.write_text('layer { name: "in" type: "HDF5Data" top: "data" '
                    'hdf5_data_param { source: "train_h5.txt" batch_size: 2 shuffle: true } }\n')
    kind, net, notes = convert_file(path)
    assert net["layers"][0]["hdf5_data"] == {"source": "train_h5.txt", "batch_size": 2, "shuffle": True}
    assert any("data sources are kept as written" in n and "train_h5.txt" in n for n in notes)


def test_a_net_built_for_one_rank_reads_its_shard(tmp_path):
    from layerforge import Net

    write_h5(tmp_path / "a.h5", data=numpy.arange(8.0).reshape(8, 1), label=numpy.arange(8.0))
    (tmp_path / "list.txt").write_text(str(tmp_path / "a.h5") + "\n")
    definition = {"name": "n", "layers": [{"name": "d", "type": "HDF5Data", "top": ["data", "label"],
                                           "hdf5_data": {"source": str(tmp_path / "list.txt"), "batch_size": 2}}]}
    net = Net(definition, phase="test", shard=(1, 2))
    assert net.layers[0].layer_param.hdf5_data.world_size == 2
    seen = []
    for _ in range(2):
        net.forward()
        seen += net.blobs["label"].data.tolist()
    assert seen == [1.0, 3.0, 5.0, 7.0]  # rank 1 of 2: rows 1, 3, 5, 7
