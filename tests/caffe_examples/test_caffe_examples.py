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

from tests.devices import needs_two_gpus

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


TRAIN_NET = """name: 'n'
layer {{ type: 'Data' name: 'data' top: 'data' top: 'label' include {{ phase: TRAIN }}
  transform_param {{ scale: 0.0039 }}
  data_param {{ source: 'db' backend: LMDB batch_size: {batch} }} }}
layer {{ type: 'Convolution' name: 'conv' bottom: 'data' top: 'conv'
  convolution_param {{ num_output: 4 kernel_size: 3 weight_filler {{ type: 'gaussian' std: 0.1 }} }} }}
layer {{ type: 'InnerProduct' name: 'ip' bottom: 'conv' top: 'ip'
  inner_product_param {{ num_output: 3 weight_filler {{ type: 'gaussian' std: 0.1 }} }} }}
layer {{ type: 'SoftmaxWithLoss' name: 'loss' bottom: 'ip' bottom: 'label' top: 'loss' }}
"""
TRAIN_SOLVER = """net: "net{batch}.prototxt"
base_lr: 0.1
momentum: 0.9
max_iter: 3
display: 1
snapshot: 3
random_seed: 5
snapshot_prefix: "out{batch}/s"
layer_wise_reduce: {layer_wise}
solver_mode: GPU
"""


@needs_two_gpus
@pytest.mark.parametrize("layer_wise, timing", [(True, True), (False, False)])
def test_train_py_on_two_gpus_trains_as_one_process_with_the_whole_batch(caffe_root, layer_wise, timing):
    """python/train.py --gpus 0 1: a process per GPU (the emulated devices where there is none), caffe.NCCL's
    broadcast and gradient averaging (layer by layer with layer_wise_reduce, Caffe's default, else after backward),
    each reading its share of the LMDB: rank 0's snapshot is one CPU process's with the whole batch."""
    import layerforge.pycaffe as caffe
    from layerforge.data.lmdb_io import LMDBWriter

    g = numpy.random.default_rng(0)
    with LMDBWriter(str(caffe_root / "db")) as w:
        for i in range(48):
            w.add(g.integers(0, 256, (3, 5, 5), dtype=numpy.uint8), i % 3)
    for batch in (4, 8):
        (caffe_root / f"net{batch}.prototxt").write_text(TRAIN_NET.format(batch=batch))
        (caffe_root / f"solver{batch}.prototxt").write_text(TRAIN_SOLVER.format(batch=batch,
                                                                                  layer_wise=str(layer_wise).lower()))
    out = run(["python/train.py", "--solver", "solver4.prototxt", "--gpus", "0", "1"] + (["--timing"] * timing),
              caffe_root, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Using devices [0, 1]" in out.stderr
    assert ("allreduce: " in out.stderr) is timing  # rank 0's timing table (before_forward ... callbacks, Timer)
    cwd = os.getcwd()
    try:
        os.chdir(caffe_root)  # Caffe resolves the solver's paths from the working directory
        caffe.set_mode_cpu()
        reference = caffe.SGDSolver("solver8.prototxt")
        reference.step(3)
        trained = caffe.Net("net4.prototxt", caffe.TRAIN, weights="out4/s_iter_3.caffemodel")
    finally:
        os.chdir(cwd)
    for name, blobs in reference.net.params.items():
        for k, blob in enumerate(blobs):
            numpy.testing.assert_allclose(trained.params[name][k].data, blob.data, rtol=1e-5, atol=1e-6,
                                          err_msg=f"{name}/{k}")


def test_the_ssd_forks_notebooks_run_cell_by_cell(caffe_root):
    """The SSD fork's examples/ssd_detect.ipynb (SSD300 detecting in an image) and examples/ssd.ipynb (one SGD step
    of SSD300's training net from VOC0712's LMDB, then its blobs, filters and prior boxes drawn), their code cells
    unchanged but for Python 3, on substitutes for the trained weights, the LMDBs (the shapes set) and VGG-16."""
    out = run([os.path.join(HERE, "notebooks.py"), caffe_root, "ssd_detect", "ssd"], caffe_root)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "===== ssd_detect.ipynb: all cells ran" in out.stdout and "===== ssd.ipynb: all cells ran" in out.stdout
    # ssd.ipynb prints fc7_mbox_loc[0, :, 1, 2] and then fc7_mbox_loc_perm[0, 1, 2, :]: Permute's (0, 2, 3, 1)
    import re
    ssd = out.stdout.split("===== ssd_detect.ipynb: all cells ran")[1]
    printed = ssd.split("----- cell 13\n")[1].split("----- cell 15")[0]
    values = re.findall(r"-?\d+\.\d*(?:e[-+]\d+)?", printed)
    assert len(values) == 48 and values[:24] == values[24:], printed
