"""``import caffe`` through ``python -m layerforge.pycaffe --python-path``, and the pycaffe behaviours
Caffe's own python tests check beyond the API surface (exceptions of Python layers, reshape before
forward, BlobProto and Datum edge cases, NCCL handles)."""
import os
import subprocess
import sys

import numpy
import pytest

import layerforge.pycaffe as caffe


def python_path():
    out = subprocess.run([sys.executable, "-m", "layerforge.pycaffe", "--python-path"], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def test_import_caffe_gives_layerforge_pycaffe_and_its_modules():
    code = ("import caffe, caffe.draw, caffe.io, caffe.coord_map, caffe.net_spec, caffe.pycaffe\n"
            "from caffe.proto import caffe_pb2\n"
            "from caffe import layers as L, params as P\n"
            "import layerforge.pycaffe as lp\n"
            "assert caffe is lp and caffe.pycaffe is lp and caffe.io is lp.io and caffe.draw is lp.draw\n"
            "assert caffe.coord_map is lp.coord_map and caffe.net_spec is lp.net_spec\n"
            "assert caffe_pb2 is lp.proto.caffe_pb2 and caffe_pb2.NetParameter().DESCRIPTOR.full_name == "
            "'caffe.NetParameter'\n"
            "assert L.Convolution is not None and P.Pooling.MAX == 0\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([python_path(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_python_path_is_not_importable_as_caffe_by_default():
    out = subprocess.run([sys.executable, "-c", "import caffe"], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, cwd="/")
    assert out.returncode != 0 and "No module named 'caffe'" in out.stderr


LAYERS = '''
import layerforge.pycaffe as caffe

class Times(caffe.Layer):
    def setup(self, bottom, top):
        if self.param_str == "refuse":
            raise KeyError("refused")
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)
    def forward(self, bottom, top):
        if bottom[0].data.min() < 0:
            raise ArithmeticError("negative input")
        top[0].data[...] = 3 * bottom[0].data
    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = 3 * top[0].diff
'''


@pytest.fixture
def python_net(tmp_path):
    (tmp_path / "times_layer.py").write_text(LAYERS)

    def make(param_str=""):
        path = tmp_path / "net.prototxt"
        path.write_text("name: 'p' force_backward: true\n"
                        "input: 'data' input_shape { dim: 10 dim: 9 dim: 8 }\n"
                        "layer { type: 'Python' name: 'a' bottom: 'data' top: 'a'\n"
                        f"  python_param {{ module: 'times_layer' layer: 'Times' param_str: '{param_str}' }} }}\n"
                        "layer { type: 'Python' name: 'b' bottom: 'a' top: 'b'\n"
                        "  python_param { module: 'times_layer' layer: 'Times' } }\n")
        return caffe.Net(str(path), caffe.TEST)
    yield make
    sys.modules.pop("times_layer", None)


def test_a_python_layers_exception_reaches_the_caller_as_itself(python_net):
    with pytest.raises(KeyError, match="refused"):
        python_net("refuse")
    net = python_net()
    net.blobs["data"].data[...] = -1
    with pytest.raises(ArithmeticError, match="negative input"):
        net.forward()


@pytest.mark.parametrize("shape", [(4, 4, 4, 4), (2, 3), (10, 9, 8)])
def test_reshaping_an_input_blob_reshapes_the_net_at_the_next_forward(python_net, shape):
    net = python_net()
    net.blobs["data"].reshape(*shape)
    net.blobs["data"].data[...] = 2
    out = net.forward()
    assert all(blob.data.shape == shape for blob in net.blobs.values())
    numpy.testing.assert_array_equal(out["b"], numpy.full(shape, 18))
    net.blobs["b"].diff[...] = 1
    numpy.testing.assert_array_equal(net.backward()["data"], numpy.full(shape, 9))


def test_blobproto_with_too_few_values_for_its_shape_is_a_value_error():
    blob = caffe.proto.caffe_pb2.BlobProto()
    blob.data.extend(numpy.zeros(100).tolist())  # no shape: a scalar, but 100 values
    with pytest.raises(ValueError, match="100 values"):
        caffe.io.blobproto_to_array(blob)
    scalar = caffe.proto.caffe_pb2.BlobProto()
    scalar.data.append(123)
    assert caffe.io.blobproto_to_array(scalar) == 123


def test_a_datum_without_label_leaves_the_field_out():
    image = numpy.ones((3, 10, 10))
    labelled, unlabelled = caffe.io.array_to_datum(image, label=1), caffe.io.array_to_datum(image)
    assert labelled.HasField("label") and not unlabelled.HasField("label")
    assert len(labelled.SerializeToString()) == len(unlabelled.SerializeToString()) + 2  # tag + varint 1


def test_nccl_handles_follow_availability():
    if caffe.has_nccl():
        assert isinstance(caffe.NCCL.new_uid(), bytes)
    else:
        with pytest.raises(caffe.LayerforgeError, match="NCCL is not available"):
            caffe.NCCL.new_uid()


def test_nccl_without_a_device_names_the_alternative(no_gpu):
    assert not caffe.has_nccl()
    with pytest.raises(caffe.LayerforgeError, match="--devices"):
        caffe.NCCL(None, b"")


# the first lines of a Caffe checkout's python/caffe/__init__.py and pycaffe.py
CAFFES_INIT = "from .pycaffe import Net, SGDSolver\nfrom ._caffe import init_log, log\n"
CAFFES_PYCAFFE = "from ._caffe import Net, SGDSolver\n"
NOTEBOOK_START = ("import sys\ncaffe_root = {root!r} + '/'\nsys.path.insert(0, caffe_root + 'python')\n"
                  "import caffe\nfrom caffe import layers as L\nfrom caffe.proto import caffe_pb2\n"
                  "import layerforge.pycaffe\nprint(caffe is layerforge.pycaffe, getattr(caffe, 'BUILT', False))\n")


def caffe_checkout(tmp_path, built=False):
    """A Caffe checkout's python/caffe package, with or without the _caffe extension Caffe's build makes."""
    package = tmp_path / "caffe" / "python" / "caffe"
    package.mkdir(parents=True)
    if built:  # stands for a compiled Caffe: its package imports fine
        (package / "_caffe.so").write_bytes(b"")
        (package / "__init__.py").write_text("BUILT = True\n")
    else:
        (package / "__init__.py").write_text(CAFFES_INIT)
        (package / "pycaffe.py").write_text(CAFFES_PYCAFFE)
    return str(tmp_path / "caffe")


def run_notebook_start(root, env):
    return subprocess.run([sys.executable, "-c", NOTEBOOK_START.format(root=root)], capture_output=True, text=True,
                          env=env, cwd=root)


def test_without_the_hook_a_caffe_checkouts_python_folder_fails_as_in_the_issue(tmp_path):
    out = run_notebook_start(caffe_checkout(tmp_path), dict(os.environ))
    assert out.returncode != 0 and "No module named 'caffe._caffe'" in out.stderr


def test_python_path_step_replaces_an_unbuilt_caffe_checkout_put_ahead_on_the_path(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([python_path(), os.environ.get("PYTHONPATH", "")]))
    out = run_notebook_start(caffe_checkout(tmp_path), env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


def test_python_path_step_leaves_a_built_caffe_alone(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([python_path(), os.environ.get("PYTHONPATH", "")]))
    out = run_notebook_start(caffe_checkout(tmp_path, built=True), env)
    assert out.returncode != 0 and "cannot import name 'layers' from 'caffe'" in out.stderr  # the "built" one ran


def test_installed_hook_works_without_pythonpath(tmp_path):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    subprocess.run([sys.executable, "-m", "layerforge.pycaffe", "--install-hook", "--site-dir", str(site_dir)],
                   check=True, capture_output=True)
    pth = site_dir / "layerforge-caffe.pth"
    assert pth.read_text().splitlines()[0] == python_path()
    root = caffe_checkout(tmp_path)
    # a site-packages folder's .pth files run at interpreter start; site.addsitedir runs them the same way
    code = f"import site; site.addsitedir({str(site_dir)!r})\n" + NOTEBOOK_START.format(root=root)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(caffe.__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]
    subprocess.run([sys.executable, "-m", "layerforge.pycaffe", "--remove-hook", "--site-dir", str(site_dir)],
                   check=True, capture_output=True)
    assert not pth.exists()


# a fork's pure-Python module beside its package (the SSD fork's python/caffe/model_libs.py builds nets with NetSpec)
FORK_MODEL_LIBS = '''import caffe
from caffe import layers as L, params as P


def ConvReLU(net, from_layer, name, num_output):
    net[name] = L.Convolution(net[from_layer], num_output=num_output, kernel_size=3, pad=1)
    net[name + "_relu"] = L.ReLU(net[name], in_place=True)
    net[name + "_pool"] = L.Pooling(net[name], pool=P.Pooling.MAX, kernel_size=2, stride=2)
    return net
'''
FORK_SCRIPT_START = NOTEBOOK_START + (
    "from caffe.model_libs import *\nnet = caffe.NetSpec()\nnet.data = L.Input(shape=dict(dim=[1, 3, 8, 8]))\n"
    "ConvReLU(net, 'data', 'conv1', 4)\nprint(list(net.keys()), caffe.model_libs.__file__.startswith(caffe_root))\n"
    "print(len(net.to_proto().layer))\n")


def test_a_forks_own_python_modules_import_from_its_checkout_on_layerforges_caffe(tmp_path):
    root = caffe_checkout(tmp_path)
    (tmp_path / "caffe" / "python" / "caffe" / "model_libs.py").write_text(FORK_MODEL_LIBS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([python_path(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", FORK_SCRIPT_START.format(root=root)], capture_output=True, text=True,
                         env=env, cwd=root)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "True False"  # caffe is layerforge's
    assert lines[1] == "['data', 'conv1', 'conv1_relu', 'conv1_pool'] True" and lines[2] == "4"
