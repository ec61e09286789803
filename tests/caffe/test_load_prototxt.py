"""Net and solver files in Caffe's prototxt format load directly, whatever their name (pycaffe passes temp files)."""
import pytest

from layerforge import Net
from layerforge.errors import ConfigError
from layerforge.caffe.prototxt import is_prototxt
from layerforge.solvers import get_solver

NET = """name: 'testnet' force_backward: true
layer { type: 'DummyData' name: 'data' top: 'data' top: 'label'
  dummy_data_param { num: 5 channels: 2 height: 3 width: 4  num: 5 channels: 1 height: 1 width: 1
    data_filler { type: 'gaussian' std: 1 } data_filler { type: 'constant' } } }
layer { type: 'InnerProduct' name: 'ip' bottom: 'data' top: 'ip' inner_product_param { num_output: 3 } }
layer { type: 'SoftmaxWithLoss' name: 'loss' bottom: 'ip' bottom: 'label' top: 'loss' }
"""


@pytest.mark.parametrize("name", ["net.prototxt", "tmpab12cd", "net.pt"])
def test_prototxt_net_loads_by_content_or_extension(tmp_path, name):
    path = tmp_path / name
    path.write_text(NET)
    net = Net(str(path), phase="train")
    assert [layer.name for layer in net.layers] == ["data", "ip", "loss"]
    assert net.blobs["data"].data.shape == (5, 2, 3, 4)


def test_prototxt_solver_names_a_prototxt_net(tmp_path):
    (tmp_path / "net").write_text(NET)
    (tmp_path / "solver").write_text("net: 'net'\nbase_lr: 0.01 momentum: 0.9 lr_policy: 'fixed' max_iter: 2\n"
                                     "snapshot_after_train: false\n")
    solver = get_solver(str(tmp_path / "solver"))
    assert solver.param.base_lr == 0.01 and solver.net.name == "testnet"
    solver.step(2)
    assert solver.iter == 2


def test_yaml_is_never_taken_for_prototxt(tmp_path):
    assert not is_prototxt("net.yaml", "layer {\n")
    assert not is_prototxt("net", "name: x\nlayers:\n  - {name: a, type: Input}\n")
    assert is_prototxt("net", "name: 'x'\nlayer {\n  name: 'a'\n}\n")


def test_prototxt_error_names_the_line(tmp_path):
    path = tmp_path / "bad"
    path.write_text(NET.replace("num_output: 3", "num_ouput: 3"))
    with pytest.raises(ConfigError, match=r"bad:5: .*num_ouput"):
        Net(str(path))
