"""Caffe's own example notebook and scripts run unchanged against ``import caffe`` -> layerforge (issue 37).

The Caffe files are under caffe/ (BVLC/caffe's, see caffe/README.md), copied to a temporary Caffe-root-like folder;
each runs in its own process with the PYTHONPATH step of docs/caffe-migration.md (notebooks.pycaffe_env). The
datasets and weights they would download are substitutes (caffe_notebooks.py): the bundled MNIST digits as idx files,
random-initialised caffemodels written by layerforge.
"""
import os
import shutil
import subprocess
import sys

import numpy
import pytest

from .notebooks import HERE, pycaffe_env

PYTHON = sys.executable


@pytest.fixture
def caffe_root(tmp_path):
    root = tmp_path / "caffe"
    shutil.copytree(os.path.join(HERE, "caffe"), root)
    return root


def run(args, cwd, timeout=600):
    return subprocess.run([PYTHON, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=pycaffe_env(),
                          timeout=timeout)


def test_siamese_notebook_runs_cell_by_cell(caffe_root):
    out = run([os.path.join(HERE, "notebooks.py"), caffe_root, "siamese"], caffe_root)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "===== mnist_siamese.ipynb: all cells ran" in out.stdout
    assert [line for line in out.stdout.splitlines() if line.startswith("----- cell")] == [
        f"----- cell {i}" for i in (1, 3, 5, 7, 9)]


TINY = """name: 'tiny'
input: 'data' input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
layer { name: 'conv' type: 'Convolution' bottom: 'data' top: 'conv'
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: 'xavier' } } }
layer { name: 'ip' type: 'InnerProduct' bottom: 'conv' top: 'ip'
  inner_product_param { num_output: 5 weight_filler { type: 'xavier' } } }
layer { name: 'prob' type: 'Softmax' bottom: 'ip' top: 'prob' }
"""


@pytest.mark.parametrize("center_only", [False, True])
def test_classify_py_runs_unchanged(caffe_root, center_only):
    import cv2

    import layerforge.pycaffe as caffe

    (caffe_root / "tiny.prototxt").write_text(TINY)
    caffe.Net(str(caffe_root / "tiny.prototxt"), caffe.TEST).save(str(caffe_root / "tiny.caffemodel"))
    images = caffe_root / "images"
    images.mkdir()
    rs = numpy.random.RandomState(0)
    for i in range(3):
        cv2.imwrite(str(images / f"{i}.jpg"), rs.randint(0, 256, size=(20, 16, 3)).astype(numpy.uint8))
    args = ["python/classify.py", "--model_def", "tiny.prototxt", "--pretrained_model", "tiny.caffemodel",
            "--images_dim", "12,12", "--mean_file", "", "images", "out.npy"]
    args += ["--center_only"] if center_only else []
    out = run(args, caffe_root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Classifying 3 inputs." in out.stdout
    predictions = numpy.load(caffe_root / "out.npy")
    assert predictions.shape == (3, 5)
    numpy.testing.assert_allclose(predictions.sum(axis=1), 1.0, rtol=1e-5)


def test_draw_net_py_runs_unchanged(caffe_root):
    out = run(["python/draw_net.py", "examples/siamese/mnist_siamese.prototxt", "siamese.dot", "--rankdir", "TB"],
              caffe_root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Drawing net to siamese.dot" in out.stdout
    dot = (caffe_root / "siamese.dot").read_text()
    assert "rankdir=TB" in dot.replace(" ", "").replace('"', "") and "conv1" in dot and "ip2" in dot


def test_linreg_with_its_python_loss_layer(caffe_root):
    code = ("import sys, numpy\nsys.path.insert(0, 'python')\nsys.path.insert(0, 'examples/pycaffe/layers')\n"
            "import caffe\nnet = caffe.Net('examples/pycaffe/linreg.prototxt', caffe.TRAIN)\n"
            "loss = float(net.forward()['loss'][0])\n"
            "d = net.blobs['ipx'].data - net.blobs['ipy'].data\n"
            "assert abs(loss - (d ** 2).sum() / 10 / 2) < 1e-4 * max(1, loss), loss\n"
            "net.backward()\n"
            "assert numpy.abs(net.params['ipx'][0].diff).sum() > 0\n"
            "print('linreg ok', type(net.layers[-1]).__name__)\n")
    out = run(["-c", code], caffe_root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("linreg ok")
