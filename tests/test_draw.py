"""``layerforge draw``: DOT text with layers as boxes and blobs (with shapes) on edges."""
import pathlib
import re

import pytest

from layerforge import cli
from layerforge.commands import draw
from layerforge.errors import LayerforgeError
from layerforge.net import Net

ROOT = pathlib.Path(__file__).resolve().parents[1]

TINY = {
    "name": 'tiny "net"',
    "layers": [
        {"name": "input", "type": "Input", "top": ["data", "label"], "input": {"shape": [[4, 1, 12, 12], [4]]}},
        {"name": "conv", "type": "Convolution", "bottom": "data", "top": "conv",
         "convolution": {"num_output": 6, "kernel_size": 5, "weight_filler": {"type": "xavier"}}},
        {"name": "relu", "type": "ReLU", "bottom": "conv", "top": "conv"},
        {"name": "ip", "type": "InnerProduct", "bottom": "conv", "top": "ip", "inner_product": {"num_output": 10}},
        {"name": "acc", "type": "Accuracy", "bottom": ["ip", "label"], "top": "acc"},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"},
    ],
}


def edges(dot):
    """``{(from label's first line, to label's first line): edge label}``."""
    names = {m.group(1): m.group(2).split("\\n")[0] for m in re.finditer(r'^  (\w+) \[label="([^"]*)', dot, re.M)}
    return {(names[a], names[b]): label for a, b, label in
            re.findall(r'^  (\w+) -> (\w+) \[label="([^"]*)"', dot, re.M)}


def test_boxes_carry_type_and_given_parameters():
    dot = draw.to_dot(Net(TINY, phase="test"))
    assert dot.startswith('digraph "tiny \\"net\\"" {')
    assert 'label="conv\\n(Convolution)\\nnum_output: 6  kernel_size: 5"' in dot
    assert 'label="ip\\n(InnerProduct)\\nnum_output: 10"' in dot
    assert "xavier" not in dot  # fillers are left out
    assert "Split" not in dot   # ip and label feed two layers: the inserted Split layers are not drawn


def test_edges_are_blobs_with_shapes_and_in_place_layers_chain():
    e = edges(draw.to_dot(Net(TINY, phase="test")))
    assert e[("input", "conv")] == "data\\n4x1x12x12"
    assert e[("conv", "relu")] == "conv\\n4x6x8x8"
    assert e[("relu", "ip")] == "conv\\n4x6x8x8"     # ip reads the ReLU's value of blob conv
    assert e[("ip", "acc")] == e[("ip", "loss")] == "ip\\n4x10"
    assert e[("input", "loss")] == "label\\n4"
    assert e[("loss", "loss")] == "scalar" and e[("acc", "acc")] == "scalar"   # output ellipses
    assert ("input", "relu") not in e


def test_zoo_net_block_names_and_batch_override(capsys):
    assert cli.main(["draw", str(ROOT / "configs/googlenet_net.yaml"), "--batch", "1", "--phase", "test"]) == 0
    e = edges(capsys.readouterr().out)
    assert e[("inception_3a/relu_pool_proj", "inception_3a/output")] == "inception_3a/pool_proj\\n1x32x28x28"
    assert e[("inception_3a/output", "inception_3b/1x1")] == "inception_3a/output\\n1x256x28x28"
    assert not any(a.startswith("loss1") for a, b in e)   # auxiliary classifiers are TRAIN only


def test_dot_file_and_missing_graphviz(tmp_path, monkeypatch, capsys):
    net = Net(TINY, phase="test")
    text = draw.to_dot(net)
    assert draw.render(text, str(tmp_path / "n.dot")) == str(tmp_path / "n.dot")
    assert (tmp_path / "n.dot").read_text() == text
    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    with pytest.raises(LayerforgeError, match=r"needs Graphviz's 'dot' \(not installed\): wrote the DOT text to "):
        draw.render(text, str(tmp_path / "n.svg"))
    assert (tmp_path / "n.dot").read_text() == text
    with pytest.raises(LayerforgeError, match="unknown output format '.jpg'"):
        draw.render(text, str(tmp_path / "n.jpg"))


@pytest.mark.skipif(draw.shutil.which("dot") is None, reason="Graphviz is not installed")
def test_svg_through_graphviz(tmp_path):
    draw.render(draw.to_dot(Net(TINY, phase="test")), str(tmp_path / "n.svg"))
    assert "<svg" in (tmp_path / "n.svg").read_text()
