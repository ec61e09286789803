"""Image data layers on decode workers: a batch depends only on (seed, position), never on the number of
workers; resume is exact across worker counts; bad records and dead workers are named in one line."""
import logging
import os
import re
import signal

import cv2
import numpy
import pytest

from layerforge import rng
from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.data.datum import array_to_datum, encoded_datum
from layerforge.data.lmdb_io import LMDBWriter, encode_image_record, encode_record
from layerforge.errors import DataError
from layerforge.layers import create_layer
from layerforge.layers.data import input_display, input_stats, reset_input_stats

IMAGES = numpy.random.default_rng(5).integers(0, 256, size=(11, 3, 20, 24), dtype=numpy.uint8)  # C, H, W (BGR)
TRANSFORM = {"crop_size": 16, "mirror": True, "mean_value": [104, 117, 123], "scale": 0.5}


def jpeg(image):
    return cv2.imencode(".jpg", image.transpose(1, 2, 0), [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()


def write_lmdb(path, kind, images=IMAGES, corrupt=None):
    """An LMDB of ``images`` as ``kind`` records; record ``corrupt`` holds bytes that are no image."""
    with LMDBWriter(path) as w:
        for i, image in enumerate(images):
            data = b"\xff\xd8 not a jpeg" if i == corrupt else jpeg(image)
            w.put({"datum": lambda: array_to_datum(image, i % 3).SerializeToString(),
                   "encoded datum": lambda: encoded_datum(data, i % 3).SerializeToString(),
                   "encoded lfr1": lambda: encode_image_record(data, image.shape, i % 3),
                   "raw lfr1": lambda: encode_record(image, i % 3)}[kind]())
    return str(path)


def write_list(tmp_path):
    lines = []
    for i, image in enumerate(IMAGES):
        cv2.imwrite(str(tmp_path / f"im{i}.png"), image.transpose(1, 2, 0))
        lines.append(f"im{i}.png {i % 3}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return str(tmp_path / "list.txt")


def write_windows(tmp_path):
    lines = []
    for i, image in enumerate(IMAGES[:4]):
        cv2.imwrite(str(tmp_path / f"win{i}.png"), image.transpose(1, 2, 0))
        lines += [f"# {i}", f"win{i}.png", "3 20 24", "3", f"{1 + i % 2} 0.8 2 3 15 17", "0 0.1 0 0 23 19",
                  f"2 0.7 {i} {i} 9 12"]
    (tmp_path / "windows.txt").write_text("\n".join(lines) + "\n")
    return str(tmp_path / "windows.txt")


def make(tmp_path, kind, workers, xp=numpy, seed=11, **block):
    """A TRAIN layer reading ``kind`` with ``workers`` decode workers, shuffling, cropping and mirroring."""
    rng.seed(seed)
    if kind == "ImageData":
        spec = {"type": "ImageData", "image_data": dict(source=write_list(tmp_path), root_folder=f"{tmp_path}/",
                                                         new_height=20, new_width=24, shuffle=True)}
    elif kind == "WindowData":
        spec = {"type": "WindowData", "window_data": dict(source=write_windows(tmp_path), fg_fraction=0.5,
                                                           context_pad=2, root_folder=f"{tmp_path}/")}
    else:
        source = tmp_path / kind.replace(" ", "_")
        spec = {"type": "Data", "data": {"source": str(source) if source.exists() else write_lmdb(source, kind)}}
    block_name = [k for k in spec if k != "type"][0]
    spec[block_name].update(dict(batch_size=4, decode_workers=workers, prefetch=2), **block)
    layer = create_layer(dict(spec, name="d", top=["data", "label"], transform=TRANSFORM), phase="TRAIN",
                         dtype=numpy.float32, xp=xp)
    top = [Blob(xp=xp), Blob(xp=xp)]
    layer.setup([], top)
    return layer, top


def take(layer, top, count):
    out = []
    for _ in range(count):
        layer.forward([], top)
        out.append((to_numpy(top[0].data).copy(), to_numpy(top[1].data).copy()))
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for (d0, l0), (d1, l1) in zip(a, b):
        numpy.testing.assert_array_equal(d0, d1)
        numpy.testing.assert_array_equal(l0, l1)


KINDS = ["encoded datum", "datum", "encoded lfr1", "raw lfr1", "ImageData", "WindowData"]


@pytest.mark.parametrize("kind", KINDS)
def test_batches_are_bit_identical_for_1_2_and_3_workers(tmp_path, kind):
    runs = []
    for workers in (1, 2, 3):
        layer, top = make(tmp_path, kind, workers)
        runs.append(take(layer, top, 6))  # 24 records of 11: past two epochs' reshuffles
        assert len(layer.decode_pool.pids) == workers
        layer.close()
    assert_same(runs[0], runs[1])
    assert_same(runs[0], runs[2])
    assert len({d.tobytes() for d, _ in runs[0]}) == 6


@pytest.mark.parametrize("kind", ["encoded datum", "raw lfr1", "ImageData"])
def test_batches_are_the_records_transformed_as_planned(tmp_path, kind, xp):
    layer, top = make(tmp_path, kind, 2, xp=xp)
    stream = layer.stream
    for position, (data, labels) in zip(range(0, 12, 4), take(layer, top, 3)):
        indices = stream.indices(position, 4)
        records = numpy.stack([layer.records.read(i)[0] for i in indices])  # in this process, one by one
        expected = layer.transformer(records, numpy.random.default_rng([stream.seed, 1, position]))
        numpy.testing.assert_array_equal(data, expected)
        numpy.testing.assert_array_equal(labels, [i % 3 for i in indices])
        assert expected.min() < -30 and expected.max() > 30  # the mean and scale were applied
    layer.close()


@pytest.mark.parametrize("kind", ["encoded datum", "WindowData"])
def test_resume_is_exact_across_worker_counts(tmp_path, kind):
    layer, top = make(tmp_path, kind, 2)
    take(layer, top, 3)
    state = layer.get_state()
    expected = take(layer, top, 4)
    layer.close()
    resumed, rtop = make(tmp_path, kind, 3, seed=99)  # another seed: the state alone decides what follows
    take(resumed, rtop, 1)
    resumed.set_state(state)
    assert_same(take(resumed, rtop, 4), expected)
    resumed.close()


def test_a_corrupt_image_on_any_worker_is_one_line_naming_its_key(tmp_path):
    source = write_lmdb(tmp_path / "db", "encoded datum", corrupt=6)
    rng.seed(0)
    layer = create_layer({"name": "d", "type": "Data", "top": ["data", "label"],
                          "data": {"source": source, "batch_size": 4, "decode_workers": 3}}, phase="TEST")
    top = [Blob(), Blob()]
    layer.setup([], top)
    decoded = [cv2.imdecode(numpy.frombuffer(jpeg(image), numpy.uint8), cv2.IMREAD_COLOR) for image in IMAGES[:4]]
    numpy.testing.assert_array_equal(take(layer, top, 1)[0][0], numpy.stack(decoded).transpose(0, 3, 1, 2))
    with pytest.raises(DataError) as e:
        take(layer, top, 1)
    assert str(e.value) == f"{source}: key '00000006': the encoded image (13 bytes) cannot be decoded"
    with pytest.raises(DataError, match="key '00000006'"):  # the layer starts again at the failed batch
        take(layer, top, 1)
    layer.close()


def test_a_worker_that_dies_is_named_with_its_record(tmp_path):
    layer, top = make(tmp_path, "encoded datum", 2, shuffle=False)
    read = layer.stream.read

    def read_or_die(index):  # the workers are forked: they run this
        if index == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return read(index)

    layer.stream.read = read_or_die
    take(layer, top, 1)
    with pytest.raises(DataError, match=r"^layer 'd' \(Data\): decode worker 0 \(pid \d+\) was killed by signal "
                                        rf"SIGKILL while reading {tmp_path}/encoded_datum: key '00000005'$"):
        take(layer, top, 1)
    layer.close()


def test_a_jpeg_that_decodes_with_errors_is_one_warning_naming_its_key(tmp_path, caplog):
    data = bytearray(jpeg(IMAGES[2]))
    data[800:860] = b"\x00" * 60  # libjpeg: "Corrupt JPEG data: 148 extraneous bytes before marker 0xd9"
    with LMDBWriter(tmp_path / "db") as w:
        for i in range(4):
            w.put(encoded_datum(bytes(data) if i == 2 else jpeg(IMAGES[i]), 0).SerializeToString())
    rng.seed(0)
    layer = create_layer({"name": "d", "type": "Data", "top": ["data"],
                          "data": {"source": str(tmp_path / "db"), "batch_size": 4, "decode_workers": 2,
                                   "prefetch": 0}},  # no batch ahead: record 2 is decoded once
                         phase="TEST")
    top = [Blob()]
    layer.setup([], top)
    with caplog.at_level(logging.WARNING, logger="layerforge"):
        layer.forward([], top)
    layer.close()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{tmp_path / 'db'}: key '00000002': the image decodes with errors: Corrupt JPEG")


def test_input_stats_of_a_net(tmp_path):
    from layerforge.net import Net

    source = write_lmdb(tmp_path / "db", "encoded datum")
    net = Net({"name": "n", "layers": [
        {"name": "d", "type": "Data", "top": ["data", "label"], "transform": TRANSFORM,
         "data": {"source": source, "batch_size": 4, "decode_workers": 2}},
        {"name": "e", "type": "Data", "top": ["data2"], "data": {"source": source, "batch_size": 3, "decode_workers": 1}},
        {"name": "s", "type": "Silence", "bottom": ["label", "data2"]}]}, phase="train")
    for _ in range(3):
        net.forward()
    stats = input_stats(net)
    assert (stats.batches, stats.images, stats.workers) == (6, 3 * 4 + 3 * 3, 3)
    assert stats.wait_s > 0 and stats.decode_s > 0 and stats.rate > 0
    reset_input_stats(net)
    assert input_stats(net).images == 0
    net.forward()
    line = input_display(net)(0.1, 1)
    assert re.fullmatch(r"input [\d,]+ img/s, waited [\d.]+ ms per batch \([\d.]+% of the time\); 3 decode workers "
                        r"could deliver [\d,]+ img/s", line), line
    assert input_stats(net).images == 0  # each display starts a new window
    assert input_display(Net({"name": "n", "layers": [{"name": "x", "type": "Input", "top": ["x"],
                                                        "input": {"shape": [[1]]}}]})) is None
    for layer in net.layers[:2]:
        layer.close()


def test_the_trace_shows_the_loops_waits_and_each_workers_decodes(tmp_path):
    from layerforge import trace
    from layerforge.trace.events import load_trace

    layer, top = make(tmp_path, "encoded datum", 2)
    trace.start(str(tmp_path / "t.json"), iterations=None)
    for k in range(3):
        trace.iteration(k)
        layer.forward([], top)
    trace.finish()
    layer.close()
    doc = load_trace(str(tmp_path / "t.json"))
    rows = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [(e["name"], rows[e["tid"]], e["args"]) for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "data"]
    waits = [s for s in spans if s[0] == "d"]
    assert [(row, args["records"]) for _, row, args in waits] == [("compute", 4)] * 3
    decodes = [(row, args["records"], args["layer"]) for name, row, args in spans if name == "decode"]
    assert {row for row, _, _ in decodes} == {"data", "data 1"} and {(n, la) for _, n, la in decodes} == {(2, "d")}


AFTER_OPENCV_IN_THE_PARENT = """
import sys, cv2, numpy
from layerforge.blob import Blob
from layerforge.layers import create_layer
from tests.layers.test_data_workers import write_lmdb
big = numpy.zeros((600, 800, 3), numpy.uint8)
cv2.warpAffine(big, numpy.eye(2, 3), (800, 600), flags=cv2.INTER_CUBIC)  # starts OpenCV's thread pool
layer = create_layer({"name": "d", "type": "Data", "top": ["data", "label"],
                      "data": {"source": write_lmdb(sys.argv[1], "encoded datum"), "batch_size": 4, "decode_workers": 2},
                      "transform": {"resize_param": {"height": 40, "width": 30, "interp_mode": ["CUBIC"]}}})
top = [Blob(), Blob()]
layer.setup([], top)
layer.forward([], top)
print(top[0].shape, cv2.getNumThreads())
layer.close()
"""


def test_workers_start_after_the_parent_used_opencvs_threads(tmp_path):
    """A worker forked after the parent's OpenCV started its thread pool decodes and resizes (it used to wait
    forever in cv2.setNumThreads for threads that did not cross the fork); the parent keeps its threads."""
    import subprocess
    import sys
    process = subprocess.Popen([sys.executable, "-c", AFTER_OPENCV_IN_THE_PARENT, str(tmp_path / "db")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("the decode workers hang after the parent used OpenCV's threads")
    assert process.returncode == 0, out
    assert out.split("\n")[-2] == f"(4, 3, 40, 30) {cv2.getNumThreads()}", out
