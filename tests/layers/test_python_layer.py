import itertools
import sys
import textwrap

import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, LayerforgeError
from layerforge.layers import create_layer
from layerforge.layers.python_layer import PythonLayerBase
from layerforge.testing import check_gradient, make_blob, run_layer

# The layers of Caffe's python/caffe/test/test_python_layer.py, plus a parametrised scale with a weight.
LAYERS = """
from layerforge.layers.python_layer import PythonLayerBase


class SimpleLayer(PythonLayerBase):
    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = 10 * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = 10 * top[0].diff


class ExceptionLayer(PythonLayerBase):
    def setup(self, bottom, top):
        raise RuntimeError("refused in setup")


class ParameterLayer(PythonLayerBase):
    def setup(self, bottom, top):
        self.blobs.add_blob(1)
        self.blobs[0].data[0] = 0

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] = 1


class PhaseLayer(PythonLayerBase):
    def reshape(self, bottom, top):
        top[0].reshape()

    def forward(self, bottom, top):
        top[0].data[()] = self.phase


class ScaleLayer(PythonLayerBase):
    '''y = factor * w * x with factor from param_str and a learnable per-channel w (N, C, ...).'''

    def setup(self, bottom, top):
        self.factor = float(self.param_str)
        w = self.blobs.add_blob(bottom[0].channels)
        w.data[...] = 1.5 + 0.25 * w.xp.arange(w.count)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def w(self, x):
        return self.blobs[0].data.reshape((1, -1) + (1,) * (x.ndim - 2))

    def forward(self, bottom, top):
        top[0].data[...] = self.factor * self.w(bottom[0].data) * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        x, gy = bottom[0].data, top[0].diff
        if propagate_down[0]:
            bottom[0].diff[...] = self.factor * self.w(x) * gy
        axes = (0,) + tuple(range(2, x.ndim))
        self.blobs[0].diff[...] += self.factor * (gy * x).sum(axis=axes)
"""

_count = itertools.count()


@pytest.fixture
def module(tmp_path, monkeypatch):
    """A fresh module of LAYERS in tmp_path (on sys.path); its name is unique to the test."""
    name = f"pylayers_{next(_count)}"
    (tmp_path / f"{name}.py").write_text(LAYERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def make(module, layer, xp=numpy, param_str="", phase="TRAIN", bottom=("data",), top=("y",)):
    return create_layer({"name": "py", "type": "Python", "bottom": list(bottom), "top": list(top),
                         "python": {"module": module, "layer": layer, "param_str": param_str}},
                        phase=phase, dtype=numpy.float64, xp=xp)


def test_simple_layer_multiplies_by_ten(xp, module):
    x = numpy.arange(6.0).reshape(2, 3)
    y, gx, params = run_layer(make(module, "SimpleLayer", xp), x, numpy.full((2, 3), 7.0), xp)
    numpy.testing.assert_array_equal(y, 10 * x)
    numpy.testing.assert_array_equal(gx, 70.0)
    assert params == []


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (2, 3, 2, 2)])
@pytest.mark.parametrize("factor", ["2.5", "-0.5"])
def test_scale_layer_gradient_and_values(xp, module, shape, factor):
    x = numpy.random.default_rng(3).standard_normal(shape)
    gy = numpy.random.default_rng(4).standard_normal(shape)
    y, gx, (gw,) = run_layer(make(module, "ScaleLayer", xp, param_str=factor), x, gy, xp)
    w = (1.5 + 0.25 * numpy.arange(3)).reshape((1, 3) + (1,) * (len(shape) - 2))
    f = float(factor)
    numpy.testing.assert_allclose(y, f * w * x, rtol=1e-12)
    numpy.testing.assert_allclose(gx, f * w * gy, rtol=1e-12)
    numpy.testing.assert_allclose(gw, f * (gy * x).sum(axis=(0,) + tuple(range(2, len(shape)))), rtol=1e-12)
    layer = make(module, "ScaleLayer", xp, param_str=factor)
    assert check_gradient(layer, [make_blob(x, xp=xp)], [Blob((), numpy.float64, xp)]) == x.size + 3


def test_scale_layer_matches_torch(module):
    torch = pytest.importorskip("torch")
    x = numpy.random.default_rng(5).standard_normal((2, 3, 4))
    gy = numpy.random.default_rng(6).standard_normal((2, 3, 4))
    y, gx, (gw,) = run_layer(make(module, "ScaleLayer", param_str="2.0"), x, gy)
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(1.5 + 0.25 * numpy.arange(3), requires_grad=True)
    ty = 2.0 * tw.view(1, 3, 1) * tx
    ty.backward(torch.tensor(gy))
    numpy.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12)
    numpy.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-12)
    numpy.testing.assert_allclose(gw, tw.grad.numpy(), rtol=1e-12)


def test_param_str_phase_and_blobs_reach_the_instance(module):
    layer = make(module, "ScaleLayer", param_str="3", phase="TEST")
    layer.setup([make_blob(numpy.ones((1, 3)))], [Blob()])
    assert isinstance(layer.impl, PythonLayerBase)
    assert layer.impl.param_str == "3" and layer.impl.phase == 1 and layer.impl.factor == 3.0
    assert layer.blobs is layer.impl.blobs and [b.shape for b in layer.blobs] == [(3,)]
    assert layer.blobs[0].dtype == numpy.float64


NET = """name: 'pythonnet' force_backward: true
input: 'data' input_shape {{ dim: 10 dim: 9 dim: 8 }}
layer {{ type: 'Python' name: 'one' bottom: 'data' top: 'one'
  python_param {{ module: '{m}' layer: 'SimpleLayer' }} }}
layer {{ type: 'Python' name: 'two' bottom: 'one' top: 'two'
  python_param {{ module: '{m}' layer: 'SimpleLayer' }} }}
layer {{ type: 'Python' name: 'three' bottom: 'two' top: 'three'
  python_param {{ module: '{m}' layer: 'SimpleLayer' }} }}
"""


def net_file(tmp_path, text, name="net.prototxt"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_caffe_python_net_forward_backward_reshape(module, tmp_path):
    from layerforge.net import Net
    net = Net(net_file(tmp_path, NET.format(m=module)), phase="train", dtype="float64")
    net.blobs["data"].data[...] = 8
    net.forward()
    numpy.testing.assert_array_equal(net.blobs["three"].data, 10 ** 3 * 8)
    net.blobs["three"].diff[...] = 7
    net.backward()
    numpy.testing.assert_array_equal(net.blobs["data"].diff, 10 ** 3 * 7)
    net.blobs["data"].reshape(4, 4, 4, 4)
    net.reshape()
    net.forward()
    assert all(blob.shape == (4, 4, 4, 4) for blob in net.blobs.values())


def test_caffe_parameter_layer_learns_saves_and_loads(module, tmp_path):
    from layerforge.net import Net
    path = net_file(tmp_path, f"""name: 'pythonnet' force_backward: true
        input: 'data' input_shape {{ dim: 10 dim: 9 dim: 8 }}
        layer {{ type: 'Python' name: 'layer' bottom: 'data' top: 'top'
          python_param {{ module: '{module}' layer: 'ParameterLayer' }} }}""")
    net = Net(path, phase="train", dtype="float64")
    net.forward()
    net.backward()
    layer = net.layer_dict["layer"]
    assert layer.blobs[0].data[0] == 0 and layer.blobs[0].diff[0] == 1
    assert net.learnable_params == [layer.blobs[0]]
    layer.blobs[0].data[0] += layer.blobs[0].diff[0]
    net.save(str(tmp_path / "w.npz"))
    layer.blobs[0].data[0] = -1
    net.copy_from(str(tmp_path / "w.npz"))
    assert layer.impl.blobs[0].data[0] == 1


def test_caffe_phase_layer(module, tmp_path):
    from layerforge.net import Net
    path = net_file(tmp_path, f"""name: 'pythonnet' force_backward: true
        layer {{ type: 'Python' name: 'layer' top: 'phase'
          python_param {{ module: '{module}' layer: 'PhaseLayer' }} }}""")
    for phase, value in (("train", 0), ("test", 1)):
        assert Net(path, phase=phase).forward()["phase"] == value


def test_module_next_to_the_net_file_is_found(tmp_path):
    from layerforge.net import Net
    (tmp_path / "beside_net_layers.py").write_text(LAYERS)
    try:
        net = Net(net_file(tmp_path, NET.format(m="beside_net_layers")), phase="test", dtype="float64")
        assert net.forward(data=numpy.ones((10, 9, 8)))["three"][0, 0, 0] == 1000
        assert str(tmp_path) not in sys.path
    finally:
        sys.modules.pop("beside_net_layers", None)


@pytest.mark.parametrize("python,message", [
    ({"module": "no_such_module_here", "layer": "X"}, "python.module 'no_such_module_here' not found on sys.path"),
    ({"module": "{m}", "layer": "Missing"}, "python.module '{m}' has no class 'Missing'"),
    ({"module": "{m}", "layer": "ExceptionLayer"},
     "python.module '{m}' class 'ExceptionLayer': setup raised RuntimeError: refused in setup"),
    ({"module": "{m}", "layer": "ScaleLayer", "param_str": "two"},
     "class 'ScaleLayer': setup raised ValueError: could not convert string to float: 'two'"),
    ({"module": "os; import x", "layer": "X"}, "is not a module name"),
])
def test_errors_are_one_line_naming_layer_and_module(module, python, message):
    python = {k: v.format(m=module) for k, v in python.items()}
    layer = create_layer({"name": "py", "type": "Python", "bottom": ["data"], "top": ["y"], "python": python})
    with pytest.raises(ConfigError) as e:
        layer.setup([make_blob(numpy.ones((2, 3)))], [Blob()])
    text = str(e.value)
    assert text.startswith("layer 'py' (Python):") and message.format(m=module) in text and "\n" not in text


def test_errors_in_forward_and_a_missing_backward(module, tmp_path):
    broken = tmp_path / f"{module}_broken.py"
    broken.write_text("from layerforge.layers.python_layer import PythonLayerBase\n"
                      "class Half(PythonLayerBase):\n"
                      "    def reshape(self, bottom, top):\n"
                      "        top[0].reshape(bottom[0].shape)\n"
                      "    def forward(self, bottom, top):\n"
                      "        if bottom[0].num > 1:\n"
                      "            raise ValueError('one row only')\n"
                      "        top[0].data[...] = bottom[0].data / 2\n")
    try:
        layer = make(f"{module}_broken", "Half")
        bottom, top = [make_blob(numpy.ones((1, 3)))], [Blob()]
        layer.setup(bottom, top)
        layer.forward(bottom, top)
        numpy.testing.assert_array_equal(top[0].data, [[0.5, 0.5, 0.5]])
        with pytest.raises(LayerforgeError, match="class 'Half': backward raised NotImplementedError: Half defines no "
                                                  r"backward\(top, propagate_down, bottom\)"):
            layer.backward(top, [True], bottom)
        bottom[0].reshape(2, 3)
        layer.reshape(bottom, top)
        message = r"^layer 'py' \(Python\): .* forward raised ValueError: one row only$"
        with pytest.raises(LayerforgeError, match=message):
            layer.forward(bottom, top)
    finally:
        sys.modules.pop(f"{module}_broken", None)


def test_add_blob_shapes_and_blob_accessors(module):
    layer = make(module, "SimpleLayer")
    layer.setup([make_blob(numpy.ones((2, 3, 4, 5)))], [Blob()])
    b = layer.blobs.add_blob(2, 3)
    c = layer.blobs.add_blob((4,))
    assert (b.shape, c.shape, b.count, to_numpy(c.diff).tolist()) == ((2, 3), (4,), 6, [0, 0, 0, 0])
    top = Blob()
    layer.reshape([make_blob(numpy.ones((2, 3, 4, 5)))], [top])
    assert (top.num, top.channels, top.height, top.width) == (2, 3, 4, 5)


def test_caffe_prototxt_with_hdf5_memory_and_python_layers_runs(module, tmp_path, monkeypatch):
    import h5py

    from layerforge.net import Net
    monkeypatch.chdir(tmp_path)
    x = numpy.arange(12.0).reshape(4, 3)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("data", data=x)
        f.create_dataset("label", data=numpy.arange(4.0))
    (tmp_path / "list.txt").write_text("d.h5\n")
    path = net_file(tmp_path, f"""name: "mixed"
        layer {{ name: "h5" type: "HDF5Data" top: "data" top: "label"
                hdf5_data_param {{ source: "list.txt" batch_size: 2 }} }}
        layer {{ name: "mem" type: "MemoryData" top: "mdata" top: "mlabel"
                memory_data_param {{ batch_size: 2 channels: 3 height: 1 width: 1 }} }}
        layer {{ name: "ten" type: "Python" bottom: "mdata" top: "ten"
                python_param {{ module: "{module}" layer: "SimpleLayer" }} }}
        layer {{ name: "scale" type: "Python" bottom: "data" top: "scaled"
                python_param {{ module: "{module}" layer: "ScaleLayer" param_str: "0.5" share_in_parallel: false }} }}
        layer {{ name: "loss" type: "EuclideanLoss" bottom: "scaled" bottom: "data" top: "loss" }}
        layer {{ name: "silence" type: "Silence" bottom: "label" bottom: "mlabel" bottom: "ten" }}
        """)
    net = Net(path, phase="train", dtype="float64")
    net.layer_dict["mem"].reset(numpy.ones((2, 3, 1, 1), numpy.float32), numpy.zeros(2))
    w = 1.5 + 0.25 * numpy.arange(3)
    for rows in (x[:2], x[2:]):
        net.forward()
        net.backward()
        numpy.testing.assert_array_equal(net.blobs["ten"].data, 10.0)
        numpy.testing.assert_allclose(net.blobs["scaled"].data, 0.5 * w * rows, rtol=1e-12)
        assert net.loss == pytest.approx(((0.5 * w - 1) * rows).__pow__(2).sum() / 4)
    assert net.learnable_params == net.layer_dict["scale"].blobs


# py-faster-rcnn's way: a package in the project's lib/ (put on sys.path by the user's script, as its
# tools/_init_paths.py does), importing `caffe`, YAML in the old pycaffe's `param_str_`, settings looked up by
# str(self.phase), and a sibling package of its own
FASTER_RCNN_LIB = {
    "fast_rcnn/__init__.py": "",
    "fast_rcnn/config.py": "cfg = {'TRAIN': {'POST_NMS_TOP_N': 3}, 'TEST': {'POST_NMS_TOP_N': 2}}\n",
    "rpn/__init__.py": "",
    "rpn/proposal_layer.py": textwrap.dedent("""
        import caffe
        import numpy as np
        import yaml
        from fast_rcnn.config import cfg


        class ProposalLayer(caffe.Layer):
            def setup(self, bottom, top):
                self._feat_stride = yaml.safe_load(self.param_str_)['feat_stride']
                top[0].reshape(1, 5)

            def forward(self, bottom, top):
                n = cfg[str(self.phase)]['POST_NMS_TOP_N']
                rois = np.zeros((n, 5), dtype=np.float32)
                rois[:, 3:] = self._feat_stride
                top[0].reshape(*rois.shape)
                top[0].data[...] = rois

            def backward(self, top, propagate_down, bottom):
                pass

            def reshape(self, bottom, top):
                pass
        """),
}


def test_a_faster_rcnn_style_proposal_layer_loads_from_the_projects_lib(tmp_path, monkeypatch):
    import os

    import layerforge.pycaffe
    from layerforge.net import Net
    for name, text in FASTER_RCNN_LIB.items():
        (tmp_path / "lib" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "lib" / name).write_text(text)
    # `import caffe` is layerforge's pycaffe (python -m layerforge.pycaffe --python-path)
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(layerforge.pycaffe.__file__), "python"))
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    path = net_file(tmp_path, """name: 'rpn'
        layer { name: 'proposal' type: 'Python' top: 'rois'
          python_param { module: 'rpn.proposal_layer' layer: 'ProposalLayer' param_str: "'feat_stride': 16" } }""")
    try:
        for phase, rows in (("test", 2), ("train", 3)):
            rois = Net(path, phase=phase).forward()["rois"]
            assert rois.shape == (rows, 5) and (rois[:, 3:] == 16).all()
    finally:
        for name in ("rpn.proposal_layer", "rpn", "fast_rcnn.config", "fast_rcnn", "caffe"):
            sys.modules.pop(name, None)


def test_phase_is_an_int_named_as_caffes_enum():
    from layerforge.layers.python_layer import TEST, TRAIN
    import layerforge.pycaffe as caffe
    assert (caffe.TRAIN, caffe.TEST) == (0, 1) and (str(caffe.TRAIN), str(caffe.TEST)) == ("TRAIN", "TEST")
    assert caffe.TEST is TEST and caffe.TRAIN is TRAIN


def test_a_module_in_the_current_directory_is_found(tmp_path, monkeypatch):
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "cwd_layers.py").write_text(LAYERS)
    monkeypatch.chdir(tmp_path / "here")
    try:
        layer = make("cwd_layers", "SimpleLayer")
        y, _, _ = run_layer(layer, numpy.ones((1, 2)), numpy.ones((1, 2)))
        assert y.tolist() == [[10.0, 10.0]] and str(tmp_path / "here") not in sys.path
    finally:
        sys.modules.pop("cwd_layers", None)


def test_a_module_importing_caffe_says_how_to_get_layerforges(tmp_path, monkeypatch):
    import importlib.util
    if importlib.util.find_spec("caffe") is not None:
        pytest.skip("a caffe module is importable here")
    (tmp_path / "needs_caffe.py").write_text("import caffe\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    layer = create_layer({"name": "py", "type": "Python", "top": ["y"],
                          "python": {"module": "needs_caffe", "layer": "X"}})
    with pytest.raises(ConfigError, match=r"No module named 'caffe' \(for layerforge's pycaffe as caffe: export "
                                          r"PYTHONPATH=\$\(python -m layerforge.pycaffe --python-path\)"):
        layer.setup([], [Blob()])


ROIDB_LAYER = """
import caffe


class RoIDataLayer(caffe.Layer):
    # py-faster-rcnn's roi_data_layer: the solver script hands it the roidb through net.layers[0]
    def setup(self, bottom, top):
        self._roidb = None
        top[0].reshape(1, 4)

    def set_roidb(self, roidb):
        self._roidb = roidb

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        top[0].data[...] = self._roidb[0]["boxes"]

    def backward(self, top, propagate_down, bottom):
        pass
"""


def test_pycaffe_gives_a_python_layer_as_the_users_own_object(tmp_path, monkeypatch):
    """As in Caffe, ``net.layers[i]`` of a Python layer is the instance the net made: py-faster-rcnn's train.py
    calls ``solver.net.layers[0].set_roidb(roidb)`` before the first step."""
    import layerforge.pycaffe as caffe

    monkeypatch.setitem(sys.modules, "caffe", caffe)
    (tmp_path / "roi_data_layer.py").write_text(ROIDB_LAYER)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = net_file(tmp_path, """
        layer { name: 'input-data' type: 'Python' top: 'rois' python_param { module: 'roi_data_layer'
          layer: 'RoIDataLayer' } }
        layer { name: 'ip' type: 'InnerProduct' bottom: 'rois' top: 'ip' inner_product_param { num_output: 2 } }""")
    net = caffe.Net(path, caffe.TRAIN)
    layer = net.layers[0]
    assert type(layer).__name__ == "RoIDataLayer" and layer is net.layer_dict["input-data"]
    assert layer.type == "Python" and net.layers[1].type == "InnerProduct"
    layer.set_roidb([{"boxes": numpy.array([1, 2, 30, 40])}])
    net.forward()
    numpy.testing.assert_array_equal(net.blobs["rois"].data, [[1, 2, 30, 40]])
    sys.modules.pop("roi_data_layer", None)
