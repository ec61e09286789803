"""convert_imageset and compute_image_mean (the command modules, and the tools/ wrappers)."""
import argparse
import os
import subprocess
import sys

import cv2
import numpy
import pytest

from layerforge.caffe.caffe_pb import Datum
from layerforge.commands import compute_image_mean, convert_imageset
from layerforge.data.lmdb_io import LMDBReader
from layerforge.errors import DataError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(module, argv):
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


def make_folder(root, sizes=((4, 6), (4, 6), (4, 6))):
    for i, (h, w) in enumerate(sizes):
        folder = root / ("cat" if i % 2 else "ant")
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / f"{i}.png"), numpy.full((h, w, 3), (i, 10 * i, 20 * i), numpy.uint8))
    (root / "ant" / "notes.txt").write_text("not an image")


def test_list_file_to_lmdb_and_mean(tmp_path, capsys):
    make_folder(tmp_path / "img")
    (tmp_path / "list.txt").write_text("ant/0.png 5\ncat/1.png 6\nant/2.png 7\n")
    assert run(convert_imageset, [str(tmp_path / "img"), str(tmp_path / "list.txt"), str(tmp_path / "db")]) == 0
    reader = LMDBReader(tmp_path / "db")
    records = reader.read_many(range(3))
    assert [label for _, label in records] == [5, 6, 7]
    numpy.testing.assert_array_equal(records[2][0][:, 0, 0], [2, 20, 40])  # B, G, R
    assert "wrote 3 images (3x4x6)" in capsys.readouterr().out
    assert run(compute_image_mean, [str(tmp_path / "db"), str(tmp_path / "mean.npy")]) == 0
    mean = numpy.load(tmp_path / "mean.npy")
    assert mean.shape == (3, 4, 6) and mean.dtype == numpy.float32
    numpy.testing.assert_allclose(mean[:, 1, 1], [1, 10, 20])
    assert run(compute_image_mean, [str(tmp_path / "db"), str(tmp_path / "mean.npz")]) == 0
    numpy.testing.assert_array_equal(numpy.load(tmp_path / "mean.npz")["mean"], mean)


@pytest.mark.parametrize("encoded", [False, True])
def test_class_folders_resize_gray_shuffle(tmp_path, encoded):
    make_folder(tmp_path / "img", sizes=((4, 6), (9, 5), (7, 7)))
    argv = [str(tmp_path / "img"), "-", str(tmp_path / "db"), "--resize-height", "3", "--resize-width", "2",
            "--gray", "--shuffle"] + (["--encoded"] if encoded else [])
    assert run(convert_imageset, argv) == 0
    records = LMDBReader(tmp_path / "db").read_many(range(3))
    assert all(a.shape == (1, 3, 2) for a, _ in records)
    assert sorted(label for _, label in records) == [0, 0, 1]  # ant: 0.png, 2.png; cat: 1.png
    assert (tmp_path / "db" / "labels.txt").read_text() == "0 ant\n1 cat\n"


@pytest.mark.parametrize("fmt", ["datum", "lfr1"])
def test_encoded_keeps_original_bytes(tmp_path, fmt):
    make_folder(tmp_path / "img")
    assert run(convert_imageset, [str(tmp_path / "img"), "-", str(tmp_path / "db"), "--encoded", "--format", fmt]) == 0
    reader = LMDBReader(tmp_path / "db")
    assert reader.format == {"datum": "Datum", "lfr1": "LFR1"}[fmt]
    array, label = reader.read(0)
    assert label == 0 and array.shape == (3, 4, 6)
    with reader.env.begin() as txn:
        value = txn.get(b"00000000")
    original = (tmp_path / "img" / "ant" / "0.png").read_bytes()
    if fmt == "lfr1":
        assert value[24:] == original
    else:
        datum = Datum.FromString(value)
        assert datum.encoded and datum.data == original and datum.label == 0


def test_encode_type_reencodes_as_jpg(tmp_path):
    make_folder(tmp_path / "img")
    assert run(convert_imageset, [str(tmp_path / "img"), "-", str(tmp_path / "db"), "--encoded",
                                  "--encode_type", "jpg"]) == 0
    with LMDBReader(tmp_path / "db").env.begin() as txn:
        datum = Datum.FromString(txn.get(b"00000001"))
    assert datum.encoded and datum.data[:2] == b"\xff\xd8" and datum.label == 0  # a JPEG of ant/2.png
    array, _ = LMDBReader(tmp_path / "db").read(1)
    numpy.testing.assert_allclose(array[:, 0, 0], [2, 20, 40], atol=3)  # B, G, R of ant/2.png, lossy


def test_caffe_flag_spellings_and_check_size(tmp_path):
    make_folder(tmp_path / "img", sizes=((4, 6), (4, 6), (5, 6)))
    argv = [str(tmp_path / "img"), "-", str(tmp_path / "db"), "--backend", "lmdb", "--check_size"]
    with pytest.raises(DataError) as e:
        run(convert_imageset, argv)
    assert str(e.value) == (f"image '{tmp_path / 'img' / 'ant' / '2.png'}': size 3x5x6 differs from the first "
                            "image's 3x4x6 (--check_size)")
    assert not (tmp_path / "db").exists()
    assert run(convert_imageset, argv + ["--resize_height=3", "--resize_width=2"]) == 0
    assert [a.shape for a, _ in LMDBReader(tmp_path / "db").read_many(range(3))] == [(3, 3, 2)] * 3


def test_unreadable_image_and_existing_db(tmp_path):
    make_folder(tmp_path / "img")
    (tmp_path / "list.txt").write_text("ant/0.png 0\nant/missing.png 1\n")
    with pytest.raises(DataError) as e:
        run(convert_imageset, [str(tmp_path / "img"), str(tmp_path / "list.txt"), str(tmp_path / "db")])
    assert str(e.value) == (f"{tmp_path / 'list.txt'}:2: image '{tmp_path / 'img' / 'ant' / 'missing.png'}': "
                            "cannot read the image (missing, or not an image)")
    assert not (tmp_path / "db").exists()
    run(convert_imageset, [str(tmp_path / "img"), "-", str(tmp_path / "db")])
    with pytest.raises(DataError, match="already exists"):
        run(convert_imageset, [str(tmp_path / "img"), "-", str(tmp_path / "db")])


def test_tools_wrappers(tmp_path):
    make_folder(tmp_path / "img")
    out = subprocess.run([sys.executable, os.path.join(REPO, "tools", "convert_imageset"), str(tmp_path / "img"),
                          "-", str(tmp_path / "db")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "wrote 3 images" in out.stdout
    out = subprocess.run([sys.executable, os.path.join(REPO, "tools", "compute_image_mean"), str(tmp_path / "nodb"),
                          str(tmp_path / "m.npy")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr == f"error: {tmp_path / 'nodb'}: no LMDB database there (no data.mdb)\n"


# ---------------------------------------------------------------------------------------------------------------
# the SSD fork's data preparation, as its data/VOC0712/create_list.sh and create_data.sh (through
# scripts/create_annoset.py) call build/tools/: here tools/


def tool(name, *args, cwd=None):
    return subprocess.run([sys.executable, os.path.join(REPO, "tools", name), *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def test_gflags_command_lines_become_layerforges():
    from layerforge.cli import gflags_argv
    from layerforge.commands import convert_annoset
    from layerforge.errors import LayerforgeError

    parser = argparse.ArgumentParser(prog="convert_annoset")
    convert_annoset.add_arguments(parser)
    argv = ["--anno_type=detection", "--check_label=True", "--shuffle=False", "-encoded", "--encode_type=",
            "--label_map_file=m.prototxt", "--min_dim", "0", "--nogray", "-resize_height=300", "root/", "l.txt", "db"]
    assert gflags_argv(parser, argv) == ["--anno_type", "detection", "--check_label", "--encoded",
                                         "--label_map_file", "m.prototxt", "--min_dim", "0", "--resize_height", "300",
                                         "root/", "l.txt", "db"]
    args = parser.parse_args(gflags_argv(parser, argv))
    assert (args.check_label, args.shuffle, args.encoded, args.encode_type, args.gray) == (True, False, True, None,
                                                                                          False)
    with pytest.raises(LayerforgeError, match="flag --shuffle is true or false, not 'maybe'"):
        gflags_argv(parser, ["--shuffle=maybe"])


def voc_tree(root):
    """A VOC-like tree: JPEGImages of three sizes, their Annotations, the fork's list files."""
    sizes, names = [(40, 60), (50, 30), (64, 64)], ["000001", "000002", "000003"]
    (root / "VOC2007" / "JPEGImages").mkdir(parents=True)
    (root / "VOC2007" / "Annotations").mkdir()
    g = numpy.random.default_rng(0)
    for name, (h, w), cls in zip(names, sizes, ["cat", "dog", "cat"]):
        cv2.imwrite(str(root / "VOC2007" / "JPEGImages" / f"{name}.jpg"), g.integers(0, 255, (h, w, 3), numpy.uint8))
        (root / "VOC2007" / "Annotations" / f"{name}.xml").write_text(
            f"<annotation><size><width>{w}</width><height>{h}</height></size><object><name>{cls}</name>"
            f"<difficult>0</difficult><bndbox><xmin>2</xmin><ymin>3</ymin><xmax>{w // 2}</xmax><ymax>{h // 2}</ymax>"
            "</bndbox></object></annotation>")
    (root / "test.txt").write_text("".join(f"VOC2007/JPEGImages/{n}.jpg VOC2007/Annotations/{n}.xml\n"
                                           for n in names))
    return sizes, names


def test_the_ssd_forks_data_preparation_runs_with_layerforges_tools(tmp_path):
    sizes, names = voc_tree(tmp_path)
    (tmp_path / "map.txt").write_text("cat\ndog\n")
    out = tool("create_label_map", "--delimiter= ", "--include_background=true", tmp_path / "map.txt",
               tmp_path / "labelmap_voc.prototxt")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "labelmap_voc.prototxt").read_text() == (
        'item {\n  name: "none_of_the_above"\n  label: 0\n  display_name: "background"\n}\n'
        'item {\n  name: "cat"\n  label: 1\n  display_name: "cat"\n}\n'
        'item {\n  name: "dog"\n  label: 2\n  display_name: "dog"\n}\n')
    out = tool("get_image_size", f"{tmp_path}/", tmp_path / "test.txt", tmp_path / "test_name_size.txt")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "test_name_size.txt").read_text() == "".join(f"{n} {h} {w}\n" for n, (h, w) in
                                                                   zip(names, sizes))
    # scripts/create_annoset.py's command for --anno-type=detection --encode-type=jpg --encoded (create_data.sh)
    out = tool("convert_annoset", "--anno_type=detection", "--label_type=xml",
               f"--label_map_file={tmp_path / 'labelmap_voc.prototxt'}", "--check_label=True", "--min_dim=0",
               "--max_dim=0", "--resize_height=0", "--resize_width=0", "--backend=lmdb", "--shuffle=False",
               "--check_size=False", "--encode_type=jpg", "--encoded=True", "--gray=False", f"{tmp_path}/",
               tmp_path / "test.txt", tmp_path / "VOC2007_test_lmdb")
    assert out.returncode == 0, out.stderr
    from layerforge.data.annotations import decode_annotated
    reader = LMDBReader(str(tmp_path / "VOC2007_test_lmdb"), decode=decode_annotated)
    records = [reader.read(i) for i in range(len(reader))]
    assert [r[0].shape[1:] for r in records] == sizes
    assert [int(r[1][0, 0]) for r in records] == [1, 2, 1]  # cat, dog, cat through the label map


def test_get_image_size_with_ids_and_its_errors(tmp_path):
    sizes, names = voc_tree(tmp_path)
    (tmp_path / "ids.txt").write_text("000001 7\n000002 9\n000003 11\n")
    out = tool("get_image_size", "--name_id_file", tmp_path / "ids.txt", tmp_path, tmp_path / "test.txt",
               tmp_path / "sizes.txt")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "sizes.txt").read_text() == "7 40 60\n9 50 30\n11 64 64\n"
    (tmp_path / "ids.txt").write_text("000001 7\n000002 9\n")
    out = tool("get_image_size", f"--name_id_file={tmp_path / 'ids.txt'}", tmp_path, tmp_path / "test.txt",
               tmp_path / "sizes.txt")
    assert out.returncode == 2 and out.stderr == f"error: {tmp_path / 'ids.txt'}: 2 names for 3 images in " \
                                                 f"{tmp_path / 'test.txt'}\n"
    (tmp_path / "VOC2007" / "JPEGImages" / "000002.jpg").unlink()
    out = tool("get_image_size", tmp_path, tmp_path / "test.txt", tmp_path / "sizes.txt")
    assert out.returncode == 2 and "test.txt: image 2 '" in out.stderr and out.stderr.count("\n") == 1


def test_create_label_map_fields(tmp_path):
    (tmp_path / "map.txt").write_text("n01;3;tench\nn02;5;goldfish\n")
    out = tool("create_label_map", "--delimiter=;", tmp_path / "map.txt", tmp_path / "m.prototxt")
    assert out.returncode == 0, out.stderr
    from layerforge.data.annotations import label_to_name, read_label_map
    assert label_to_name(read_label_map(str(tmp_path / "m.prototxt"))) == {3: "tench", 5: "goldfish"}
    (tmp_path / "map.txt").write_text("cat 1\ndog\n")
    out = tool("create_label_map", tmp_path / "map.txt", tmp_path / "m.prototxt")
    assert out.returncode == 2 and out.stderr == f"error: {tmp_path / 'map.txt'}:2: 1 fields, the first line has 2\n"
