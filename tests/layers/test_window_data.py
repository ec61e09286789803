import gc

import cv2
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer

IMAGE = numpy.random.default_rng(0).integers(0, 256, size=(3, 8, 8)).astype(numpy.uint8)  # C, H, W (BGR)
FLAT = (numpy.array([10, 20, 30], numpy.uint8)[:, None, None] * numpy.ones((1, 8, 8), numpy.uint8))


def write_windows(tmp_path, entries, name="windows.txt"):
    """entries: [(image array (C, H, W), [(class, overlap, x1, y1, x2, y2), ...]), ...] -> the window file."""
    lines = []
    for i, (image, windows) in enumerate(entries):
        cv2.imwrite(str(tmp_path / f"img{i}.png"), image.transpose(1, 2, 0))
        lines += [f"# {i}", f"img{i}.png", *map(str, image.shape), str(len(windows))]
        lines += [" ".join(map(str, w)) for w in windows]
    (tmp_path / name).write_text("\n".join(lines) + "\n")
    return tmp_path / name


def make(xp, source, crop_size, phase="TEST", transform=None, **window):
    window = dict(dict(source=str(source), batch_size=1, fg_fraction=1.0, prefetch=0), **window)
    layer = create_layer({"name": "win", "type": "WindowData", "top": ["data", "label"], "window_data": window,
                          "transform": dict(crop_size=crop_size, **(transform or {}))},
                         phase=phase, dtype=numpy.float64, xp=xp)
    top = [Blob((), numpy.float64, xp), Blob((), numpy.float64, xp)]
    layer.setup([], top)
    return layer, top


def forward(layer, top):
    layer.forward([], top)
    return to_numpy(top[0].data).copy(), to_numpy(top[1].data).copy()


def test_warp_of_a_window_its_own_size_is_the_window_minus_mean_times_scale(xp, tmp_path):
    source = write_windows(tmp_path, [(IMAGE, [(1, 0.9, 2, 1, 5, 4)])])
    layer, top = make(xp, source, 4, transform=dict(mean_value=[1, 2, 3], scale=0.5), root_folder=f"{tmp_path}/")
    assert top[0].shape == (1, 3, 4, 4) and top[1].shape == (1,)
    data, label = forward(layer, top)
    mean = numpy.array([1.0, 2, 3])[:, None, None]
    numpy.testing.assert_array_equal(data[0], (IMAGE[:, 1:5, 2:6] - mean) * 0.5)
    numpy.testing.assert_array_equal(label, [1])


def test_mean_file_is_taken_at_the_centre(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = write_windows(tmp_path, [(IMAGE, [(1, 0.9, 2, 1, 5, 4)])])
    mean = numpy.arange(3 * 6 * 6, dtype=numpy.float32).reshape(3, 6, 6)
    numpy.save(tmp_path / "mean.npy", mean)
    layer, top = make(numpy, source, 4, transform=dict(mean_file="mean.npy"))
    data, _ = forward(layer, top)
    numpy.testing.assert_array_equal(data[0], IMAGE[:, 1:5, 2:6] - mean[:, 1:5, 1:5])


def test_square_mode_takes_the_square_around_the_window(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # window 2 wide, 4 tall centred at (3, 2): square of half side 2 -> x 1..5, y 0..4 (Caffe's inclusive 5x5)
    source = write_windows(tmp_path, [(IMAGE, [(4, 1.0, 2, 0, 3, 3)])])
    layer, top = make(numpy, source, 5, crop_mode="square")
    data, label = forward(layer, top)
    numpy.testing.assert_array_equal(data[0], IMAGE[:, 0:5, 1:6])
    assert label[0] == 4


def test_context_padding_past_the_image_edge_stays_zero_and_mirrors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # window 0..3 grown by 8 / (8 - 4) about its centre 2: -2..6, clipped to 0..6 and warped into 6 of 8
    # pixels after round(2 * 8 / 9) = 2 pixels of zero padding (left and top; right when mirrored)
    source = write_windows(tmp_path, [(FLAT, [(1, 0.9, 0, 0, 3, 3)])])
    layer, top = make(numpy, source, 8, context_pad=2)
    data, _ = forward(layer, top)
    expect = numpy.zeros((3, 8, 8))
    expect[:, 2:, 2:] = FLAT[:, :6, :6]
    numpy.testing.assert_array_equal(data[0], expect)
    mirrored = numpy.zeros((3, 8, 8))
    mirrored[:, 2:, :6] = FLAT[:, :6, :6]
    layer, top = make(numpy, source, 8, "TRAIN", dict(mirror=True), context_pad=2, batch_size=16)
    data, _ = forward(layer, top)
    flips = [numpy.array_equal(d, mirrored) for d in data]
    assert all(f or numpy.array_equal(d, expect) for f, d in zip(flips, data))
    assert 0 < sum(flips) < 16


def test_mirror_flips_the_warped_window(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = write_windows(tmp_path, [(IMAGE, [(1, 0.9, 2, 1, 5, 4)])])
    layer, top = make(numpy, source, 4, "TRAIN", dict(mirror=True), batch_size=12)
    data, _ = forward(layer, top)
    window = IMAGE[:, 1:5, 2:6].astype(float)
    flipped = [numpy.array_equal(d, window[:, :, ::-1]) for d in data]
    assert all(f or numpy.array_equal(d, window) for f, d in zip(flipped, data)) and 0 < sum(flipped) < 12


@pytest.mark.parametrize("batch_size,fg_fraction", [(8, 0.25), (5, 0.5), (4, 0.0)])
def test_batches_hold_background_then_foreground_windows(tmp_path, monkeypatch, batch_size, fg_fraction):
    monkeypatch.chdir(tmp_path)
    source = write_windows(tmp_path, [
        (IMAGE, [(1, 0.9, 2, 1, 5, 4), (7, 0.1, 0, 0, 7, 7), (3, 0.4, 0, 0, 3, 3)]),
        (FLAT, [(2, 0.6, 0, 0, 3, 3), (5, 0.0, 4, 4, 7, 7)]),
    ])
    layer, top = make(numpy, source, 4, batch_size=batch_size, fg_fraction=fg_fraction, bg_threshold=0.3)
    num_fg = int(batch_size * fg_fraction)
    labels = numpy.stack([forward(layer, top)[1] for _ in range(6)])
    assert (labels[:, :batch_size - num_fg] == 0).all()  # background windows get class 0
    assert set(labels[:, batch_size - num_fg:].ravel()) == ({1, 2} if num_fg else set())  # 0.4: neither
    state = layer.get_state()
    following = [forward(layer, top) for _ in range(2)]
    layer.set_state(state)
    for data, label in following:
        again = forward(layer, top)
        numpy.testing.assert_array_equal(again[0], data)
        numpy.testing.assert_array_equal(again[1], label)


def test_prefetched_batches_equal_direct_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = write_windows(tmp_path, [(IMAGE, [(1, 0.9, 2, 1, 5, 4), (0, 0.1, 0, 0, 7, 7)])])
    direct = make(numpy, source, 4, "TRAIN", dict(mirror=True), batch_size=4, fg_fraction=0.5)
    state = direct[0].get_state()
    expected = [forward(*direct) for _ in range(3)]
    layer, top = make(numpy, source, 4, "TRAIN", dict(mirror=True), batch_size=4, fg_fraction=0.5, prefetch=2,
                      cache_images=True)
    layer.set_state(state)
    for data, label in expected:
        got = forward(layer, top)
        numpy.testing.assert_array_equal(got[0], data)
        numpy.testing.assert_array_equal(got[1], label)
    pool, workers = layer.decode_pool, list(layer.decode_pool.pids)
    del layer, top
    gc.collect()
    assert workers and [pool.exit_codes[pid] for pid in workers] == [0] * len(workers)  # no reference to the layer


@pytest.mark.parametrize("text,message", [
    ("# 0\nimg0.png\n3 8 8\n1\n1 0.9 0 0 3\n", "ends in the middle of an image entry"),
    ("# 0\nimg0.png\n3 8 8\n1\n1 high 0 0 3 3\n", r"windows.txt:5: expected 6 numbers, got '1 high 0 0 3 3'"),
    ("0\nimg0.png\n3 8 8\n0\n", r"windows.txt:1: expected '# image_index', got '0'"),
    ("# 0\nimg0.png\n4 8 8\n0\n", "has 4 channels"),
    ("", "the window file is empty"),
    ("# 0\nimg0.png\n3 8 8\n1\n0 0.9 0 0 3 3\n", "a foreground window has class 0"),
    ("# 0\nimg0.png\n3 8 8\n1\n1 0.2 0 0 3 3\n", "no foreground windows, and each batch needs 1"),
])
def test_bad_window_files_are_one_line(tmp_path, monkeypatch, text, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "windows.txt").write_text(text)
    with pytest.raises(DataError, match=message) as e:
        make(numpy, tmp_path / "windows.txt", 4)
    assert str(e.value).startswith("layer 'win' (WindowData): window_data.source") and "\n" not in str(e.value)


def test_missing_image_and_window_outside_the_image(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="cannot read the window file"):
        make(numpy, tmp_path / "nothere.txt", 4)
    (tmp_path / "windows.txt").write_text("# 0\nnone.png\n3 8 8\n1\n1 0.9 0 0 3 3\n")
    layer, top = make(numpy, tmp_path / "windows.txt", 4)
    with pytest.raises(DataError, match=r"layer 'win' \(WindowData\): image 'none.png': cannot read it"):
        layer.forward([], top)
    source = write_windows(tmp_path, [(IMAGE, [(1, 0.9, 4, 4, 9, 9)])])
    layer, top = make(numpy, source, 4)
    with pytest.raises(DataError, match=r"window \(4, 4, 9, 9\) lies outside its 8x8 image 'img0.png'"):
        layer.forward([], top)


@pytest.mark.parametrize("transform,window,message", [
    ({}, {}, "transform.crop_size"),
    ({"crop_size": 4}, {"context_pad": 2}, "context_pad 2 leaves no room in crop_size 4"),
    ({"crop_size": 4}, {"crop_mode": "stretch"}, "expected one of WARP, SQUARE"),
    ({"crop_size": 4}, {"fg_fraction": 1.5}, "must be <= 1"),
])
def test_bad_parameters_are_config_errors(transform, window, message):
    with pytest.raises(ConfigError, match=message):
        create_layer({"type": "WindowData", "top": ["data", "label"], "transform": transform,
                      "window_data": dict(source="w.txt", batch_size=2, **window)})


def test_caffe_prototxt_converts_with_its_old_transform_fields(tmp_path, monkeypatch):
    from layerforge.net import Net
    monkeypatch.chdir(tmp_path)
    write_windows(tmp_path, [(IMAGE, [(1, 0.9, 2, 1, 5, 4), (0, 0.1, 0, 0, 7, 7)])])
    path = tmp_path / "net.prototxt"
    path.write_text("""name: "rcnn"
layers { name: "win" type: WINDOW_DATA top: "data" top: "label"
         window_data_param { source: "windows.txt" batch_size: 4 fg_fraction: 0.5 crop_mode: "warp"
                             crop_size: 4 mirror: false scale: 2 context_pad: 0 } }
""")
    net = Net(str(path), phase="test", dtype="float64")
    assert net.layers[0].layer_param.transform.crop_size == 4
    net.forward()
    numpy.testing.assert_array_equal(net.blobs["label"].data, [0, 0, 1, 1])
    numpy.testing.assert_array_equal(net.blobs["data"].data[2], 2.0 * IMAGE[:, 1:5, 2:6])
