"""TensorBoard scalars written by ScalarWriter, read back with TensorBoard's own EventAccumulator."""
import numpy
import pytest

from layerforge import trace
from layerforge.errors import LayerforgeError
from layerforge.trace import recorder
from layerforge.trace.tensorboard import ScalarWriter

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def read_back(logdir):
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_read_back(tmp_path, monkeypatch):
    now = [50.0]
    monkeypatch.setattr(recorder, "clock", lambda: now[0])  # the iteration times and waits, exactly
    writer = ScalarWriter(str(tmp_path / "tb"), images_per_iteration=64)
    for k, (seconds, data_wait, comm_wait) in enumerate([(0.5, 0.0, 0.01), (0.25, 0.05, 0.02), (0.5, 0.125, 0.0)]):
        with trace.wait("data"):
            now[0] += data_wait
        with trace.wait("comm"):
            now[0] += comm_wait
        now[0] += seconds - data_wait - comm_wait
        writer.train(k, loss=2.0 / (k + 1), learning_rate=0.01 * 0.5 ** k)
    writer.test(2, {"accuracy": 0.875, "loss": numpy.float64(0.25), "per_class": numpy.array([0.5, 1.0])})
    writer.test(2, {"accuracy": 0.5}, net_index=1)
    writer.close()
    scalars = read_back(tmp_path / "tb")
    approx = pytest.approx
    assert scalars["train/loss"] == [(0, 2.0), (1, 1.0), (2, approx(2 / 3))]
    assert scalars["train/learning_rate"] == [(0, approx(0.01)), (1, approx(0.005)), (2, approx(0.0025))]
    assert scalars["train/images_per_second"] == [(1, 256.0), (2, 128.0)]  # 64 images in 0.25 s, then in 0.5 s
    assert scalars["train/data_wait_ms"] == [(0, 0.0), (1, approx(50.0)), (2, approx(125.0))]
    assert scalars["train/comm_exposed_ms"] == [(0, approx(10.0)), (1, approx(20.0)), (2, 0.0)]
    assert scalars["test/accuracy"] == [(2, 0.875)] and scalars["test/loss"] == [(2, 0.25)]
    assert scalars["test/per_class/0"] == [(2, 0.5)] and scalars["test/per_class/1"] == [(2, 1.0)]
    assert scalars["test1/accuracy"] == [(2, 0.5)]


def test_without_images_no_rate(tmp_path):
    writer = ScalarWriter(str(tmp_path / "tb"))
    writer.train(0, 1.0)
    writer.train(1, 0.5)
    writer.close()
    assert sorted(read_back(tmp_path / "tb")) == ["train/comm_exposed_ms", "train/data_wait_ms", "train/loss"]


def test_unwritable_folder_is_one_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LayerforgeError, match=r"--tensorboard: cannot write files in .*file/tb"):
        ScalarWriter(str(blocker / "tb"))
