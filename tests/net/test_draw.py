"""The net drawn as a graph (layerforge/net/drawing.py, ``layerforge draw``): DOT text with layers as boxes and blobs
(with shapes) on edges."""
import pathlib
import re

import pytest

from layerforge import cli
from layerforge.net import drawing
from layerforge.errors import LayerforgeError
from layerforge.net import Net

ROOT = pathlib.Path(__file__).resolve().parents[2]

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
    dot = drawing.to_dot(Net(TINY, phase="test"))
    assert dot.startswith('digraph "tiny \\"net\\"" {')
    assert 'label="conv\\n(Convolution)\\nnum_output: 6  kernel_size: 5"' in dot
    assert 'label="ip\\n(InnerProduct)\\nnum_output: 10"' in dot
    assert "xavier" not in dot  # fillers are left out
    assert "Split" not in dot   # ip and label feed two layers: the inserted Split layers are not drawn


def test_edges_are_blobs_with_shapes_and_in_place_layers_chain():
    e = edges(drawing.to_dot(Net(TINY, phase="test")))
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


def test_dot_file_and_missing_graphviz(tmp_path, monkeypatch):
    net = Net(TINY, phase="test")
    assert drawing.render(net, str(tmp_path / "n.dot")) == str(tmp_path / "n.dot")
    assert (tmp_path / "n.dot").read_text() == drawing.to_dot(net)
    monkeypatch.setattr(drawing.shutil, "which", lambda name: None)  # no Graphviz: matplotlib draws it
    drawing.render(net, str(tmp_path / "n.svg"))
    svg = (tmp_path / "n.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for text in ("conv", "(Convolution)", "num_output: 6  kernel_size: 5", "4x6x8x8", "(SoftmaxWithLoss)"):
        assert text in svg, text
    with pytest.raises(LayerforgeError, match="--engine graphviz needs Graphviz's 'dot'"):
        drawing.render(net, str(tmp_path / "n.png"), engine="graphviz")
    with pytest.raises(LayerforgeError, match="unknown output format '.jpg'"):
        drawing.render(net, str(tmp_path / "n.jpg"))


@pytest.mark.parametrize("rankdir", ["TB", "LR", "BT", "RL"])
def test_matplotlib_png_of_a_zoo_net(tmp_path, rankdir):
    import matplotlib.image

    path = tmp_path / f"cifar10_quick_{rankdir}.png"
    net = Net(str(ROOT / "configs/cifar10_quick_net.yaml"), phase="test")
    drawing.render(net, str(path), rankdir, engine="matplotlib")
    image = matplotlib.image.imread(path)
    tall = image.shape[0] > image.shape[1]
    assert tall == (rankdir in ("TB", "BT"))   # ranks run down the page, or across it
    assert (image[..., :3] < 0.5).any()        # something was drawn


def test_layout_ranks_edges_downwards_and_orders_by_neighbours():
    from layerforge.net.drawing import order_ranks, ranks_of

    nodes = ["a", "b", "c", "d"]
    edges = [("a", "c", ""), ("b", "d", ""), ("a", "d", ""), ("c", "d", "")]
    rank = ranks_of(nodes, edges)
    assert rank == {"a": 0, "b": 0, "c": 1, "d": 2}
    assert all(rank[x] < rank[y] for x, y, _ in edges)
    assert order_ranks(nodes, edges, rank) == [["a", "b"], ["c"], ["d"]]


@pytest.mark.skipif(drawing.shutil.which("dot") is None, reason="Graphviz is not installed")
def test_svg_through_graphviz(tmp_path):
    drawing.render(Net(TINY, phase="test"), str(tmp_path / "n.svg"), engine="graphviz")
    assert "<svg" in (tmp_path / "n.svg").read_text()
