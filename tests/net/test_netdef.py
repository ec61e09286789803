"""Bad net definitions give one line naming file:line, layer and key (and `layerforge check` exits 2)."""
import re
import subprocess
import sys
import textwrap

import pytest

import layerforge
from layerforge.errors import ConfigError

GOOD = """\
name: tiny
layers:
  - name: input
    type: Input
    top: [data, label]
    input: {shape: [[2, 1, 8, 8], [2]]}
  - name: conv1
    type: Convolution
    bottom: data
    top: conv1
    convolution: {num_output: 4, kernel_size: 3}
  - name: ip
    type: InnerProduct
    bottom: conv1
    top: ip
    inner_product: {num_output: 3}
  - name: loss
    type: SoftmaxWithLoss
    bottom: [ip, label]
    top: loss
"""


def write(tmp_path, text, name="net.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def error_of(path):
    with pytest.raises(ConfigError) as info:
        layerforge.Net(path)
    return str(info.value)


def test_good_net_builds(tmp_path):
    net = layerforge.Net(write(tmp_path, GOOD))
    assert [la.name for la in net.layers] == ["input", "conv1", "ip", "loss"]
    assert net.blobs["conv1"].shape == (2, 4, 6, 6)


CASES = [
    ("unknown type", ("type: InnerProduct\n    bottom: conv1", "type: InnerProdcut\n    bottom: conv1"),
     ":13: layer 'ip': key 'type': unknown layer type 'InnerProdcut'; did you mean 'InnerProduct'?"),
    ("misspelled key", ("{num_output: 4, kernel_size: 3}", "{num_ouput: 4, kernel_size: 3}"),
     ":11: layer 'conv1' (Convolution): key 'convolution.num_ouput': unknown key; did you mean 'num_output'?"),
    ("misspelled layer key", ("    bottom: conv1\n    top: ip", "    botom: conv1\n    top: ip"),
     ":14: layer 'ip' (InnerProduct): key 'botom': unknown key; did you mean 'bottom'?"),
    ("missing bottom", ("bottom: conv1\n    top: ip", "bottom: conv2\n    top: ip"),
     ":14: layer 'ip' (InnerProduct): key 'bottom': bottom 'conv2' is not produced by any layer; did you mean 'conv1'?"),
    ("wrong type", ("num_output: 3}", "num_output: three}"),
     ":16: layer 'ip' (InnerProduct): key 'inner_product.num_output': expected an integer, got str 'three'"),
    ("out of range", ("kernel_size: 3}", "kernel_size: 0}"),
     ":11: layer 'conv1' (Convolution): key 'convolution.kernel_size': must be >= 1, got 0"),
    ("duplicate top", ("top: loss\n", "top: data\n"),
     ":20: layer 'loss' (SoftmaxWithLoss): key 'top': top 'data' is already produced by layer 'input' (line 3)"),
    ("block of another type", ("inner_product: {num_output: 3}", "pooling: {pool: MAX}"),
     ":16: layer 'ip' (InnerProduct): key 'pooling': block 'pooling' does not apply to InnerProduct layers"),
    ("shape mismatch", ("input: {shape: [[2, 1, 8, 8], [2]]}", "input: {shape: [[2, 1, 8, 8], [3]]}"),
     "r:(17|19): layer 'loss' \\(SoftmaxWithLoss\\): (key 'bottom': )?"),
    ("kernel larger than input", ("kernel_size: 3}", "kernel_size: 9}"),
     "r:(7|11): layer 'conv1' \\(Convolution\\): "),
]


@pytest.mark.parametrize("what,edit,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_config_message(tmp_path, what, edit, expected):
    old, new = edit
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    message = error_of(path)
    if expected.startswith("r:"):
        assert re.match(re.escape(path) + expected[1:], message), message
    else:
        assert message.startswith(path + expected), message
    assert "\n" not in message


def test_shape_mismatch_names_both_layers_and_shapes(tmp_path):
    path = write(tmp_path, GOOD.replace("[[2, 1, 8, 8], [2]]", "[[2, 1, 8, 8], [3]]"))
    message = error_of(path)
    assert "'ip' (2, 3) from layer 'ip'" in message and "'label' (3,) from layer 'input'" in message


def test_cycle(tmp_path):
    path = write(tmp_path, """\
        layers:
          - {name: input, type: Input, top: x, input: {shape: [2, 3]}}
          - {name: a, type: Eltwise, bottom: [x, c], top: b}
          - {name: c, type: ReLU, bottom: b, top: c}
        """)
    message = error_of(path)
    assert message.startswith(f"{path}:3: layer 'a' (Eltwise): key 'bottom': the layers form a cycle: 'a' -> 'c' -> 'a'")


def test_layers_in_any_order_are_sorted(tmp_path):
    path = write(tmp_path, """\
        layers:
          - {name: r, type: ReLU, bottom: h, top: out}
          - {name: f, type: InnerProduct, bottom: x, top: h, inner_product: {num_output: 2}}
          - {name: input, type: Input, top: x, input: {shape: [2, 3]}}
        """)
    assert [la.name for la in layerforge.Net(path).layers] == ["input", "f", "r"]


def test_yaml_syntax_error(tmp_path):
    path = write(tmp_path, "layers:\n  - {name: a, type: [Input\n")
    assert error_of(path).startswith(f"{path}:")


def test_unknown_top_level_key(tmp_path):
    path = write(tmp_path, GOOD.replace("name: tiny", "nmae: tiny"))
    assert error_of(path) == f"{path}:1: key 'nmae': unknown top-level key 'nmae'; did you mean 'name'?"


def test_yaml_objects_are_not_constructed(tmp_path):
    path = write(tmp_path, "name: !!python/object/apply:os.system ['true']\nlayers: []\n")
    assert "invalid YAML" in error_of(path) or "could not determine a constructor" in error_of(path)


@pytest.mark.parametrize("edit", [CASES[0][1], CASES[1][1], CASES[3][1], CASES[8][1]])
def test_check_command_exit_2_one_line(tmp_path, edit):
    path = write(tmp_path, GOOD.replace(*edit, 1))
    proc = subprocess.run([sys.executable, "-m", "layerforge", "check", path], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_check_command_ok(tmp_path):
    path = write(tmp_path, GOOD)
    proc = subprocess.run([sys.executable, "-m", "layerforge", "check", path], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{path}: OK (train: 4 layers, test: 4 layers)"
