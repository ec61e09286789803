"""caffe.draw as pycaffe's test_draw.py uses it: Caffe's own prototxt parsed into a NetParameter and drawn,
without building the net (its databases need not exist)."""
import pathlib

import pytest
from google.protobuf import text_format

import layerforge.pycaffe as caffe
from layerforge.pycaffe.proto import caffe_pb2

MODELS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "caffe-models"
NETS = ["mnist__lenet_train_test.prototxt", "bvlc_alexnet__train_val.prototxt",
        "cifar10__cifar10_quick_train_test.prototxt"]


def message(name):
    net = caffe_pb2.NetParameter()
    text_format.Merge((MODELS / name).read_text(), net)
    return net


@pytest.mark.parametrize("name", NETS)
def test_draw_net_to_file(tmp_path, name):
    if not (MODELS / name).exists():
        pytest.skip(f"{MODELS / name} is not there")
    path = tmp_path / "net.png"
    caffe.draw.draw_net_to_file(message(name), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_graph_follows_the_phase_and_names_blobs():
    if not (MODELS / NETS[0]).exists():
        pytest.skip("no Caffe models beside the repository")
    train = caffe.draw.get_pydot_graph(message(NETS[0]), "TB")
    test = caffe.draw.get_pydot_graph(message(NETS[0]), "TB", phase=caffe.TEST)
    assert train.startswith('digraph "LeNet" {') and 'label="conv1\\n(Convolution)' in train
    assert '[label="data"]' in train and '[label="pool2"]' in train  # edges carry blob names
    assert train.count("(Data)") == 1 and test.count("(Data)") == 1  # one data layer per phase
    assert "(Accuracy)" not in train and "(Accuracy)" in test
    assert caffe.draw.draw_net(message(NETS[0]), "LR", ext="svg").lstrip().startswith(b"<?xml")
