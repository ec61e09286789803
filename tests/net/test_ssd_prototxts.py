"""The SSD fork's own train/test prototxts (MobileNet-SSD's and SSD300's, tests/net/ssd_files/README.md): converted
to YAML, they build given data at the paths they name (tiny databases, batch 1), and MobileNet-SSD's run a forward
(SSD300's VGG-16 forward at 300 x 300 would cost CI seconds for nothing more)."""
import os
import shutil

import numpy
import pytest

from layerforge.solvers.caffe_import import convert_file
from layerforge.data.annotations import annotated_record
from layerforge.data.datum import array_to_datum
from layerforge.data.lmdb_io import write_lmdb_atomic
from layerforge.net.net import Net
from layerforge.solvers.param import load_solver_param
from layerforge.solvers import SOLVER_REGISTRY

FILES = os.path.join(os.path.dirname(__file__), "ssd_files")


def tiny_database(path, count=2):
    """AnnotatedDatum records of 40 x 50 colour images with two boxes each (classes 1 and 15)."""
    r = numpy.random.default_rng(0)
    boxes = numpy.array([[1, 0, 0.1, 0.2, 0.5, 0.7, 0], [15, 0, 0.4, 0.3, 0.9, 0.8, 0]], numpy.float32)
    records = [annotated_record(array_to_datum(r.integers(0, 256, (3, 40, 50), dtype=numpy.uint8), None), boxes)
               for _ in range(count)]
    write_lmdb_atomic(path, records)


def with_batch_one(net):
    for layer in net["layers"]:
        if layer.get("type") == "AnnotatedData":
            layer["data"]["batch_size"] = 1
            layer["data"]["decode_workers"] = 1
    return net


@pytest.mark.parametrize("name, sources, phase, out", [
    ("MobileNetSSD_train", ["trainval_lmdb"], "train", "mbox_loss"),
    ("MobileNetSSD_test", ["test_lmdb"], "test", "detection_eval"),
    ("SSD300_train", ["examples/VOC0712/VOC0712_trainval_lmdb"], "train", None),
    ("SSD300_test", ["examples/VOC0712/VOC0712_test_lmdb"], "test", None),
])
def test_fork_prototxt_converts_builds_and_runs(tmp_path, monkeypatch, name, sources, phase, out):
    kind, net, notes = convert_file(os.path.join(FILES, name + ".prototxt"))
    assert kind == "net" and any("data sources are kept as written" in n for n in notes)
    monkeypatch.chdir(tmp_path)
    for source in sources:
        tiny_database(source)
    os.makedirs("data/VOC0712", exist_ok=True)
    shutil.copy(os.path.join(FILES, "labelmap_voc.prototxt"), "data/VOC0712/labelmap_voc.prototxt")
    shutil.copy(os.path.join(FILES, "labelmap_voc.prototxt"), "labelmap.prototxt")
    with open("data/VOC0712/test_name_size.txt", "w") as f:
        f.write("000001 40 50\n000002 40 50\n")
    model = Net(with_batch_one(net), phase=phase)
    types = {layer.type for layer in model.layers}
    assert {"AnnotatedData", "PriorBox", "Permute"} <= types
    assert ("MultiBoxLoss" in types) == (phase == "train")
    assert ("DetectionEvaluate" in types) == (phase == "test")
    if out is None:
        return
    result = model.forward()
    if phase == "train":
        assert numpy.isfinite(float(result[out])) and float(result[out]) > 0
    else:  # the two classes' ground-truth counts lead the rows, one per class
        rows = numpy.asarray(result[out]).reshape(-1, 5)
        assert rows[:20, 0].tolist() == [-1] * 20 and rows[0, 2] == 1 and rows[14, 2] == 1


@pytest.mark.parametrize("name", ["MobileNetSSD_solver", "SSD300_solver"])
def test_fork_solvers_convert_with_detection_evaluation(name):
    kind, solver, _ = convert_file(os.path.join(FILES, name + ".prototxt"))
    assert kind == "solver" and solver["eval_type"] == "detection" and solver["ap_version"] == "11point"
    kept = {k: v for k, v in solver.items() if k not in ("train_net", "test_net", "test_iter", "test_interval")}
    sp = load_solver_param(dict(kept, net="net.yaml"), SOLVER_REGISTRY)
    assert (sp.eval_type, sp.ap_version) == ("DETECTION", "11point")
