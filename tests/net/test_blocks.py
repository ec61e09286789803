"""Reusable blocks (layerforge/net/blocks.py) and ``layerforge expand``."""
import pathlib

import pytest

from layerforge import cli
from layerforge.net.blocks import expand_blocks
from layerforge.commands.expand import expand_file
from layerforge.commands.summary import summarize
from layerforge.errors import ConfigError
from layerforge.net import Net
from layerforge.net.netdef import load_net_def, set_batch_size
from layerforge.schema import load_yaml_text

ROOT = pathlib.Path(__file__).resolve().parents[2]

NET = """\
name: blocks
blocks:
  conv_relu:
    params: {out: null, k: 3}
    layers:
      - name: "${name}"
        type: Convolution
        bottom: "${bottom}"
        top: "${name}"
        convolution: {num_output: "${out}", kernel_size: "${k}", pad: "${k // 2}"}
      - {name: "${name}_relu", type: ReLU, bottom: "${name}", top: "${name}"}
layers:
  - {name: data, type: Input, top: data, input: {shape: [2, 3, 8, 8]}}
  - {block: conv_relu, name: "conv${i}", repeat: 3, with: {out: "${4 * i}"}}
  - {block: conv_relu, names: [conv4a, conv4b], with: {out: 5, k: 1}}
  - {name: pool, type: Pooling, bottom: conv4b, top: pool, pooling: {pool: AVE, global_pooling: true}}
"""


def expand(text, path="net.yaml"):
    return expand_blocks(load_yaml_text(text, path), path)


def test_repeat_chains_instances_and_substitutes_parameters():
    layers = expand(NET)["layers"]
    names = [m["name"] for m in layers]
    assert names == ["data", "conv1", "conv1_relu", "conv2", "conv2_relu", "conv3", "conv3_relu",
                     "conv4a", "conv4a_relu", "conv4b", "conv4b_relu", "pool"]
    conv = {m["name"]: m for m in layers if m["type"] == "Convolution"}
    assert [conv[n]["bottom"] for n in ("conv1", "conv2", "conv3", "conv4a", "conv4b")] == \
        ["data", "conv1", "conv2", "conv3", "conv4a"]
    # a string that is exactly one ${expr} keeps the value's type
    assert [conv[n]["convolution"]["num_output"] for n in ("conv1", "conv2", "conv3", "conv4a")] == [4, 8, 12, 5]
    assert conv["conv4b"]["convolution"]["kernel_size"] == 1 and conv["conv4b"]["convolution"]["pad"] == 0
    assert conv["conv1"]["convolution"]["pad"] == 1


def test_expanded_layers_keep_the_block_source_lines():
    layers = expand(NET)["layers"]
    conv2 = next(m for m in layers if m["name"] == "conv2")
    assert conv2.line == 6 and conv2.line_of("convolution") == 10
    assert layers[0].line == 13


def test_the_expansion_builds_and_is_a_pure_function(tmp_path):
    raw = load_yaml_text(NET, "net.yaml")
    before = repr(raw)
    expand_blocks(raw, "net.yaml")
    assert repr(raw) == before
    path = tmp_path / "net.yaml"
    path.write_text(NET)
    net = Net(str(path), phase="test")
    assert net.blobs["pool"].shape == (2, 5, 1, 1)
    assert net.params["conv3"][0].shape == (12, 8, 3, 3)


def test_expand_output_is_a_valid_flat_net_with_the_same_summary(tmp_path):
    path = tmp_path / "net.yaml"
    path.write_text(NET)
    flat = tmp_path / "flat.yaml"
    flat.write_text(expand_file(str(path)))
    assert "blocks:" not in flat.read_text() and "${" not in flat.read_text()
    a, b = summarize(Net(str(path), phase="test")), summarize(Net(str(flat), phase="test"))
    assert a == b


def test_expand_resnet152_round_trips(tmp_path, capsys):
    assert cli.main(["expand", str(ROOT / "configs/resnet152_net.yaml"), "-o", str(tmp_path / "r.yaml")]) == 0
    flat = load_net_def(str(tmp_path / "r.yaml"))
    assert len(flat.layers) == len(load_net_def(str(ROOT / "configs/resnet152_net.yaml")).layers) == 675
    names = [lp.name for lp in flat.layers]
    assert "res4b35_branch2c" in names and "scale5c_branch2b" in names and "res4b36" not in names
    net = Net(set_batch_size(flat, 1), phase="test")
    assert net.num_learnable == 60_192_808


def test_nested_blocks_and_instance_rules():
    text = """\
blocks:
  pair:
    params: {out: 4}
    layers:
      - {name: "${name}_a", type: InnerProduct, bottom: "${bottom}", top: "${name}_a", inner_product: {num_output: "${out}"}}
      - {name: "${name}_b", type: InnerProduct, top: "${name}_b", bottom: "${name}_a", inner_product: {num_output: "${out}"}}
  quad:
    params: {width: null}
    layers:
      - {block: pair, name: "${name}/p${i}", repeat: 2, with: {out: "${width + i}"}}
layers:
  - {name: data, type: Input, top: data, input: {shape: [1, 3]}}
  - {block: quad, name: q, with: {width: 10}, include: {phase: TRAIN}}
"""
    layers = expand(text)["layers"]
    assert [m["name"] for m in layers[1:]] == ["q/p1_a", "q/p1_b", "q/p2_a", "q/p2_b"]
    assert layers[3]["bottom"] == "q/p1_b"
    assert [m["inner_product"]["num_output"] for m in layers[1:]] == [11, 11, 12, 12]
    assert all(m["include"] == {"phase": "TRAIN"} for m in layers[1:])
    assert "include" not in layers[0]


def test_literal_dollar_and_text_interpolation():
    text = """\
blocks:
  b:
    params: {c: 3}
    layers:
      - {name: "x${c}y$${c}", type: ReLU, bottom: "${bottom}", top: "${bottom}"}
layers:
  - {name: data, type: Input, top: data, input: {shape: [1, 3]}}
  - {block: b, name: n}
"""
    assert expand(text)["layers"][1]["name"] == "x3y${c}"


@pytest.mark.parametrize("snippet,message,line", [
    ('{name: "${outt}", type: ReLU, bottom: "${bottom}", top: "${bottom}"}',
     "unknown parameter 'outt' in '${outt}'; did you mean 'out'? (in instance 'c1' of block 'b', line 8)", 5),
    ('{name: "${__import__}", type: ReLU, bottom: x, top: x}', "unknown parameter '__import__'", 5),
    ('{name: "${out.real}", type: ReLU, bottom: x, top: x}', "only parameters, integers and + - * // %", 5),
    ('{name: "${out()}", type: ReLU, bottom: x, top: x}', "only parameters, integers and + - * // %", 5),
    ('{name: "${out // 0}", type: ReLU, bottom: x, top: x}', "division by zero", 5),
    ('{name: "${name + 1}", type: ReLU, bottom: x, top: x}', "needs numbers, got 'c1'", 5),
])
def test_substitution_errors_name_the_instance_and_block_line(snippet, message, line):
    text = f"""\
blocks:
  b:
    params: {{out: 2}}
    layers:
      - {snippet}
layers:
  - {{name: data, type: Input, top: data, input: {{shape: [1, 3]}}}}
  - {{block: b, name: c1}}
"""
    with pytest.raises(ConfigError) as e:
        expand(text)
    assert message in str(e.value)
    assert str(e.value).startswith(f"net.yaml:{line}:")


@pytest.mark.parametrize("instance,message", [
    ("{block: bb, name: c1}", "net.yaml:8: key 'block': unknown block 'bb'; did you mean 'b'?"),
    ("{block: b, name: c1, with: {outs: 3}}", "net.yaml:8: key 'with.outs': block 'b' has no parameter 'outs'; "
                                             "did you mean 'out'?"),
    ("{block: b, name: c1, repeat: 2}", "must contain ${i}"),
    ("{block: b, name: c1, repeat: 0}", "key 'repeat': expected a positive integer, got 0"),
    ("{block: b, name: c1, with: {out: null}}", "block parameter 'out' has no default"),
    ("{block: b, name: c1, repat: 2}", "unknown key in a block instance; did you mean 'repeat'?"),
])
def test_instance_errors(instance, message):
    text = f"""\
blocks:
  b:
    params: {{out: 2}}
    layers:
      - {{name: "${{name}}", type: ReLU, bottom: "${{bottom}}", top: "${{name}}"}}
layers:
  - {{name: data, type: Input, top: data, input: {{shape: [1, 3]}}}}
  - {instance}
"""
    with pytest.raises(ConfigError) as e:
        expand(text)
    assert message in str(e.value)


def test_layer_errors_inside_an_instance_name_the_instance(tmp_path):
    text = NET.replace('with: {out: 5, k: 1}', 'with: {out: x, k: 1}')
    path = tmp_path / "net.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_net_def(str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}:10: layer 'conv4a' (Convolution): key 'convolution.num_output': expected an integer")
    assert msg.endswith("(in instance 'conv4a' of block 'conv_relu', line 15)")


def test_self_recursive_block_is_reported():
    text = """\
blocks:
  loop:
    layers:
      - {block: loop, name: "${name}x"}
layers:
  - {name: data, type: Input, top: data, input: {shape: [1, 3]}}
  - {block: loop, name: a}
"""
    with pytest.raises(ConfigError, match="nest deeper than 16 levels"):
        expand(text)


def test_nets_without_blocks_are_returned_unchanged():
    raw = load_yaml_text("layers:\n  - {name: d, type: Input, top: d, input: {shape: [1]}}\n")
    assert expand_blocks(raw) is raw


def test_misspelt_blocks_key_gets_a_suggestion():
    with pytest.raises(ConfigError, match="did you mean 'blocks'"):
        load_net_def({"blokcs": {}, "layers": []})


def test_shape_error_inside_a_block_names_the_instance(tmp_path):
    import layerforge
    from layerforge.errors import ConfigError
    path = tmp_path / "net.yaml"
    path.write_text("""\
blocks:
  sum_with:
    params: {other: null}
    layers:
      - {name: "${name}", type: Eltwise, bottom: ["${bottom}", "${other}"], top: "${name}"}
layers:
  - {name: data, type: Input, top: [a, b], input: {shape: [[2, 3], [2, 4]]}}
  - {block: sum_with, name: s1, bottom: a, with: {other: b}}
""")
    with pytest.raises(ConfigError) as info:
        layerforge.Net(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:5: layer 's1' (Eltwise):"), message
    assert "(in instance 's1' of block 'sum_with'" in message
