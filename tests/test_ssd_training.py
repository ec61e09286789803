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


def test_layerforge_test_scores_with_the_solver_s_ap_version(tmp_path):
    # the zoo's SSD net is named by configs/ssd_shapes_solver.yaml, whose test uses 11point: so does `layerforge test`
    # (issue 51: the same weights scored 0.864 with Integral there and 0.836 in the solver's test)
    from argparse import Namespace

    from layerforge.commands.test import ap_version_of

    zoo = os.path.join(ROOT, "configs", "ssd_shapes_net.yaml")
    solver_file = os.path.join(ROOT, "configs", "ssd_shapes_solver.yaml")
    args = Namespace(model=zoo, solver=None, ap_version=None)
    assert ap_version_of(args) == ("11point", f"the ap_version of {solver_file}, which names this net")
    assert ap_version_of(Namespace(model=zoo, solver=None, ap_version="MaxIntegral"))[0] == "MaxIntegral"
    solver = tmp_path / "solver.yaml"
    solver.write_text("net: net.yaml\nbase_lr: 0.1\nap_version: MaxIntegral\n")
    assert ap_version_of(Namespace(model=zoo, solver=str(solver), ap_version=None))[0] == "MaxIntegral"
    (tmp_path / "net.yaml").write_text("name: n\nlayers: []\n")
    alone = tmp_path / "alone.yaml"
    alone.write_text("name: n\nlayers: []\n")
    assert ap_version_of(Namespace(model=str(tmp_path / "net.yaml"), solver=None, ap_version=None))[0] == "MaxIntegral"
    assert ap_version_of(Namespace(model=str(alone), solver=None, ap_version=None))[0] == "Integral"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # an untrained test net: BatchNorm's statistics are all 0
def test_layerforge_test_names_the_ap_version_it_scores_with(small_shapes, tmp_path):
    from layerforge import cli

    _, train, test = small_shapes
    (tmp_path / "net.yaml").write_text(yaml.safe_dump(zoo_net(train, test)))
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.1\neval_type: detection\nap_version: 11point\n")
    net = Net(str(tmp_path / "net.yaml"), phase="test")
    net.save(str(tmp_path / "w.npz"))
    net.layers[0].close()
    log = tmp_path / "log.txt"
    handler = logging.FileHandler(log)
    logging.getLogger("layerforge").addHandler(handler)
    try:
        assert cli.main(["test", "--model", str(tmp_path / "net.yaml"), "--weights", str(tmp_path / "w.npz"),
                         "--iterations", "1"]) == 0
    finally:
        logging.getLogger("layerforge").removeHandler(handler)
    assert f"mAP of detection_eval: 11point AP (the ap_version of {tmp_path / 'solver.yaml'}, which names this net)" \
        in log.read_text()
