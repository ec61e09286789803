import subprocess
import sys

import cv2
import numpy
import pytest

from layerforge import rng
from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer
from tests.layers.test_data import take

H, W = 4, 6


def image_of(i):
    """Image i (H, W, 3) BGR: B = 10 i + column, G = 100 + row, R = 200 + i."""
    image = numpy.zeros((H, W, 3), numpy.uint8)
    image[..., 0] = 10 * i + numpy.arange(W)
    image[..., 1] = 100 + numpy.arange(H)[:, None]
    image[..., 2] = 200 + i
    return image


def label_of(i):
    """Label image i (H, W): class (i + row + 2 column) % 11."""
    return ((i + numpy.arange(H)[:, None] + 2 * numpy.arange(W)) % 11).astype(numpy.uint8)


def write_pairs(tmp_path, n=3):
    lines = []
    for i in range(n):
        cv2.imwrite(str(tmp_path / f"img{i}.png"), image_of(i))
        cv2.imwrite(str(tmp_path / f"lab{i}.png"), label_of(i))
        lines.append(f"img{i}.png lab{i}.png")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")


def dense_layer(tmp_path, xp=numpy, phase="TRAIN", transform=None, **block):
    block = dict({"source": str(tmp_path / "list.txt"), "root_folder": str(tmp_path) + "/", "batch_size": 2,
                  "prefetch": 0}, **block)
    layer = create_layer({"name": "d", "type": "DenseImageData", "top": ["data", "label"],
                          "dense_image_data": block, "transform": transform or {}},
                         phase=phase, dtype=numpy.float32, xp=xp)
    top = [Blob(xp=xp), Blob(xp=xp)]
    layer.setup([], top)
    return layer, top


def expected(i):
    return image_of(i).transpose(2, 0, 1).astype(numpy.float32), label_of(i)[None].astype(numpy.float32)


def test_reads_pairs_in_order_and_wraps_around(tmp_path, xp):
    write_pairs(tmp_path)
    layer, top = dense_layer(tmp_path, xp, transform={"mean_value": [1, 2, 3], "scale": 0.5})
    assert top[0].shape == (2, 3, H, W) and top[1].shape == (2, 1, H, W)
    (d0, l0), (d1, l1) = take(layer, top, 2)
    for batch, labels, indices in ((d0, l0, [0, 1]), (d1, l1, [2, 0])):  # the second batch runs on to the first
        for k, i in enumerate(indices):
            image, label = expected(i)
            numpy.testing.assert_array_equal(batch[k], (image - numpy.array([1, 2, 3]).reshape(3, 1, 1)) * 0.5)
            numpy.testing.assert_array_equal(labels[k], label)  # mean and scale leave the label alone


def test_shuffle_is_seeded_and_a_permutation_per_pass(tmp_path):
    write_pairs(tmp_path, 4)

    def run():
        rng.seed(5)
        layer, top = dense_layer(tmp_path, shuffle=True)
        return take(layer, top, 4)

    batches = run()
    order = []
    for data, labels in batches:
        for k in range(2):
            i = int(data[k, 2, 0, 0]) - 200
            numpy.testing.assert_array_equal(labels[k], expected(i)[1])  # each label stays with its image
            order.append(i)
    assert sorted(order[:4]) == sorted(order[4:]) == [0, 1, 2, 3]
    assert order[:4] != [0, 1, 2, 3] or order[4:] != [0, 1, 2, 3]
    assert all((a[0] == b[0]).all() for a, b in zip(batches, run()))


def test_mirror_flips_image_and_label_together(tmp_path, xp):
    write_pairs(tmp_path, 1)
    layer, top = dense_layer(tmp_path, xp, batch_size=16, mirror=True)
    data, labels = take(layer, top, 1)[0]
    image, label = expected(0)
    flipped = [bool(data[k, 0, 0, 0] == W - 1) for k in range(16)]
    assert 0 < sum(flipped) < 16
    for k, f in enumerate(flipped):
        numpy.testing.assert_array_equal(data[k], image[:, :, ::-1] if f else image)
        numpy.testing.assert_array_equal(labels[k], label[:, :, ::-1] if f else label)


def test_crop_cuts_image_and_label_at_one_place(tmp_path):
    write_pairs(tmp_path, 1)
    layer, top = dense_layer(tmp_path, phase="TEST", batch_size=12, crop_height=2, crop_width=3)
    assert top[0].shape == (12, 3, 2, 3) and top[1].shape == (12, 1, 2, 3)
    data, labels = take(layer, top, 1)[0]
    image, label = expected(0)
    offsets = set()
    for k in range(12):
        h0, w0 = int(data[k, 1, 0, 0]) - 100, int(data[k, 0, 0, 0])  # G is 100 + row, B the column
        offsets.add((h0, w0))
        numpy.testing.assert_array_equal(data[k], image[:, h0:h0 + 2, w0:w0 + 3])
        numpy.testing.assert_array_equal(labels[k], label[:, h0:h0 + 2, w0:w0 + 3])
    assert len(offsets) > 1  # random in TEST too, as the fork crops


def test_resize_keeps_label_classes_nearest_neighbour(tmp_path):
    write_pairs(tmp_path, 1)
    layer, top = dense_layer(tmp_path, batch_size=1, new_height=7, new_width=5, is_color=False)
    assert top[0].shape == (1, 1, 7, 5) and top[1].shape == (1, 1, 7, 5)
    data, labels = take(layer, top, 1)[0]
    want = cv2.resize(label_of(0), (5, 7), interpolation=cv2.INTER_NEAREST)
    numpy.testing.assert_array_equal(labels[0, 0], want)
    grey = cv2.imread(str(tmp_path / "img0.png"), cv2.IMREAD_GRAYSCALE)
    numpy.testing.assert_array_equal(data[0, 0], cv2.resize(grey, (5, 7), interpolation=cv2.INTER_LINEAR))


def test_bad_input_names_file_line_and_path(tmp_path):
    write_pairs(tmp_path)
    listing = tmp_path / "list.txt"
    listing.write_text("img0.png lab0.png\nimg1.png\n")
    with pytest.raises(DataError, match=r"list.txt:2: expected 'image_path label_image_path', got 'img1.png'"):
        dense_layer(tmp_path)
    listing.write_text("img0.png lab0.png\nimg1.png absent.png\n")
    layer, top = dense_layer(tmp_path)
    with pytest.raises(DataError, match=r"list.txt:2: label image '.*absent.png': cannot read the image"):
        take(layer, top, 1)
    listing.write_text("gone.png lab0.png\n")
    with pytest.raises(DataError, match=r"list.txt:1: image '.*gone.png': cannot read the image"):
        dense_layer(tmp_path)
    cv2.imwrite(str(tmp_path / "small.png"), numpy.zeros((3, 3), numpy.uint8))
    listing.write_text("img0.png small.png\n")
    with pytest.raises(DataError, match=r"list.txt:1: label image '.*small.png' is 3x3, its image is 4x6"):
        dense_layer(tmp_path)
    listing.write_text("img0.png lab0.png\n")
    with pytest.raises(ConfigError, match="transform.mirror would cut or flip the image alone"):
        dense_layer(tmp_path, transform={"mirror": True})
    with pytest.raises(ConfigError, match="give both crop_height and crop_width"):
        dense_layer(tmp_path, crop_height=2)


PROTOTXT = """name: "segnet"
layer {
  name: "data"
  type: "DenseImageData"
  top: "data"
  top: "label"
  dense_image_data_param {
    source: "%s"
    root_folder: "%s/"
    batch_size: 2
    shuffle: false
  }
}
layer {
  name: "conv"
  type: "Convolution"
  bottom: "data"
  top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.1 } }
}
layer {
  name: "loss"
  type: "SoftmaxWithLoss"
  bottom: "conv"
  bottom: "label"
  top: "loss"
  loss_param { ignore_label: 10 }
}
"""


def test_prototxt_converts_and_the_net_reads_the_pairs(tmp_path):
    write_pairs(tmp_path)
    for i in range(3):  # classes below the 4 outputs, 10 ignored
        cv2.imwrite(str(tmp_path / f"lab{i}.png"), numpy.where(label_of(i) < 4, label_of(i), 10).astype(numpy.uint8))
    (tmp_path / "net.prototxt").write_text(PROTOTXT % (tmp_path / "list.txt", tmp_path))
    result = subprocess.run([sys.executable, "-m", "layerforge", "convert", str(tmp_path / "net.prototxt"),
                             "-o", str(tmp_path / "net.yaml")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "net.yaml").read_text()
    assert "type: DenseImageData" in text and "dense_image_data:" in text
    from layerforge.net import Net
    net = Net(str(tmp_path / "net.yaml"), phase="TRAIN")
    net.forward()
    labels = to_numpy(net.blobs["label"].data)
    numpy.testing.assert_array_equal(labels[1, 0], numpy.where(label_of(1) < 4, label_of(1), 10))
    numpy.testing.assert_array_equal(to_numpy(net.blobs["data"].data)[0], expected(0)[0])
    assert numpy.isfinite(float(to_numpy(net.blobs["loss"].data)))


def test_cli_refuses_a_missing_label_in_one_line(tmp_path):
    write_pairs(tmp_path, 1)
    (tmp_path / "list.txt").write_text("img0.png lab9.png\n")
    (tmp_path / "net.prototxt").write_text(PROTOTXT % (tmp_path / "list.txt", tmp_path))
    result = subprocess.run([sys.executable, "-m", "layerforge", "convert", str(tmp_path / "net.prototxt"),
                             "-o", str(tmp_path / "net.yaml")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    result = subprocess.run([sys.executable, "-m", "layerforge", "time", "--model", str(tmp_path / "net.yaml"),
                             "--iterations", "1"], capture_output=True, text=True)
    assert result.returncode != 0
    assert "lab9.png': cannot read the image" in result.stderr and "Traceback" not in result.stderr


def test_enet_label_divide_factor_reads_smaller_labels(tmp_path):
    write_pairs(tmp_path, 1)
    layer, top = dense_layer(tmp_path, batch_size=1, new_height=8, new_width=12, label_divide_factor=2)
    assert top[0].shape == (1, 3, 8, 12) and top[1].shape == (1, 1, 4, 6)
    _, labels = take(layer, top, 1)[0]
    numpy.testing.assert_array_equal(labels[0], expected(0)[1])  # 4x6 at 8x12 / 2: read as written
    with pytest.raises(ConfigError, match="label_divide_factor needs new_height and new_width"):
        dense_layer(tmp_path, label_divide_factor=2)


def test_decode_workers_and_resume_give_the_same_batches(tmp_path):
    write_pairs(tmp_path, 5)
    settings = dict(batch_size=3, shuffle=True, mirror=True, crop_height=3, crop_width=4)

    def run(workers, batches=3, state=None):
        rng.seed(2)
        layer, top = dense_layer(tmp_path, prefetch=2, decode_workers=workers, **settings)
        if state is not None:
            layer.set_state(state)
        try:
            return take(layer, top, batches), layer.get_state()
        finally:
            layer.close()

    per_core, _ = run(0)  # 0: one worker per core
    threaded, _ = run(2)
    first, state = run(1, batches=1)
    resumed, _ = run(2, batches=2, state=state)
    for (d0, l0), (d1, l1) in zip(per_core, threaded):
        numpy.testing.assert_array_equal(d0, d1)
        numpy.testing.assert_array_equal(l0, l1)
    for (d0, l0), (d1, l1) in zip(per_core, first + resumed):
        numpy.testing.assert_array_equal(d0, d1)
        numpy.testing.assert_array_equal(l0, l1)
