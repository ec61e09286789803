"""The SSD zoo entry end to end, small: `make_example_data shapes` (a few images), the zoo net trained a few
iterations by the solver with the fork's detection test (mAP logged), and `layerforge test`'s mAP."""
import logging
import os

import pytest
import yaml

from layerforge.commands.test import score
from layerforge.data import shapes
from layerforge.net.net import Net
from layerforge.solvers import get_solver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def small_shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    train, test = shapes.make(str(root), counts=(12, 6))
    return root, train, test


def zoo_net(train, test, batch=4):
    with open(os.path.join(ROOT, "configs", "ssd_shapes_net.yaml")) as f:
        net = yaml.safe_load(f)
    for layer in net["layers"]:
        if layer.get("type") == "AnnotatedData":
            is_train = layer["include"]["phase"] == "TRAIN"
            layer["data"].update(source=train if is_train else test, batch_size=batch if is_train else 3,
                                 decode_workers=1, prefetch=1)
    return net


def test_make_shapes_writes_the_fork_layout(small_shapes):
    root, train, test = small_shapes
    folder = os.path.join(root, "data", "shapes")
    for name in ("labelmap_shapes.prototxt", "trainval.txt", "test.txt", "test_name_size.txt",
                 "Annotations/000000.xml", "JPEGImages/000017.jpg"):
        assert os.path.exists(os.path.join(folder, name))
    with open(os.path.join(folder, "test.txt")) as f:
        assert f.readline().split() == ["JPEGImages/000012.jpg", "Annotations/000012.xml"]
    assert shapes.make(str(root), counts=(12, 6)) == [train, test]  # kept: nothing rewritten


def test_zoo_net_trains_and_tests_with_map(small_shapes, caplog):
    _, train, test = small_shapes
    solver = get_solver({"net_param": zoo_net(train, test), "type": "SGD", "base_lr": 0.01, "momentum": 0.9,
                         "max_iter": 3, "test_iter": [2], "test_interval": 3, "test_initialization": False,
                         "eval_type": "detection", "ap_version": "11point", "show_per_class_result": True,
                         "display": 1, "snapshot_after_train": False, "random_seed": 1})
    with caplog.at_level(logging.INFO, logger="layerforge"):
        solver.solve()
    mean_ap = solver.test_scores[0]["detection_eval"]
    assert isinstance(mean_ap, float) and 0 <= mean_ap <= 1
    assert f"Test net output #0: detection_eval = {mean_ap:.6g}"[:40] in caplog.text
    assert "class4:" in caplog.text
    for layer in solver.net.layers + solver.test_nets[0].layers:
        getattr(layer, "close", lambda: None)()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # an untrained test net: BatchNorm's statistics are all 0
def test_layerforge_test_scores_the_map(small_shapes):
    _, train, test = small_shapes
    net = Net(zoo_net(train, test), phase="test")
    means = score(net, 2, "MaxIntegral")
    assert means["detection_eval"].shape == () and 0 <= float(means["detection_eval"]) <= 1
    net.layers[0].close()
