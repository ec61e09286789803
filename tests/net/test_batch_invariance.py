"""Batch-invariant results (blas.set_batch_invariant / LAYERFORGE_BATCH_INVARIANT=1): an image's outputs are the same,
bit for bit, alone, in a batch, and at any place in it (Caffe's 02-fine-tuning notebook compares them)."""
import numpy
import pytest

from layerforge import Net
from layerforge.kernels import blas
from layerforge.kernels.autotune import candidate_engines
from layerforge.kernels.implicit_gemm import ENGINES


@pytest.fixture
def invariant(monkeypatch):
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", True)


def net_def(batch, engine):
    conv = {"weight_filler": {"type": "gaussian", "std": 0.1}, "bias_filler": {"type": "constant", "value": 0.1}}
    return {"name": "small_caffenet", "layers": [
        {"name": "data", "type": "Input", "top": "data", "input": {"shape": [batch, 3, 31, 31]}},
        {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "conv1",
         "convolution": dict(conv, num_output=16, kernel_size=5, stride=2, engine=engine)},
        {"name": "relu1", "type": "ReLU", "bottom": "conv1", "top": "conv1"},
        {"name": "norm1", "type": "LRN", "bottom": "conv1", "top": "norm1", "lrn": {"local_size": 5}},
        {"name": "pool1", "type": "Pooling", "bottom": "norm1", "top": "pool1",
         "pooling": {"pool": "MAX", "kernel_size": 3, "stride": 2}},
        {"name": "conv2", "type": "Convolution", "bottom": "pool1", "top": "conv2",
         "convolution": dict(conv, num_output=32, kernel_size=3, pad=1, group=2, engine=engine)},
        {"name": "fc6", "type": "InnerProduct", "bottom": "conv2", "top": "fc6",
         "inner_product": {"num_output": 300, "weight_filler": {"type": "gaussian", "std": 0.05}}},
        {"name": "drop6", "type": "Dropout", "bottom": "fc6", "top": "fc6"},
        {"name": "fc7", "type": "InnerProduct", "bottom": "fc6", "top": "fc7",
         "inner_product": {"num_output": 70, "weight_filler": {"type": "gaussian", "std": 0.05}}},
        {"name": "prob", "type": "Softmax", "bottom": "fc7", "top": "prob"}]}


@pytest.mark.parametrize("engine", ["AUTO", "IMPLICIT"])
def test_an_images_outputs_do_not_depend_on_its_batch(invariant, engine):
    rs = numpy.random.RandomState(0)
    images = rs.randn(7, 3, 31, 31).astype(numpy.float32) * 50
    nets = {n: Net(net_def(n, engine), phase="test") for n in (1, 3, 7)}
    for n in (1, 3):
        nets[n].share_params_with(nets[7])
    outputs = {}
    for _ in range(4):  # AUTO's trial calls run every engine it may choose: all of them are invariant here
        outputs = {n: {k: v.copy() for k, v in net.forward(data=images[:n] if n != 3 else images[4:7]).items()}
                   for n, net in nets.items()}
        fc7 = {n: net.blobs["fc7"].data.copy() for n, net in nets.items()}
        numpy.testing.assert_array_equal(fc7[1][0], fc7[7][0])
        numpy.testing.assert_array_equal(fc7[3], fc7[7][4:7])  # the same images at other places in the batch
        numpy.testing.assert_array_equal(outputs[1]["prob"][0], outputs[7]["prob"][0])
    assert all(ENGINES[name].batch_invariant for layer in nets[7].layers
               for name in getattr(layer, "engines", {}))


def test_auto_keeps_only_the_invariant_engines(invariant):
    net = Net(net_def(4, "AUTO"), phase="test")
    assert [sorted(layer.engines) for layer in net.layers if layer.type == "Convolution"] == [["IMPLICIT"]] * 2


@pytest.mark.parametrize("switch, expected", [(False, ("IM2COL", "IMPLICIT", "WINOGRAD_F2")), (True, ("IMPLICIT",))])
def test_the_autotuner_offers_only_invariant_engines_under_the_switch(monkeypatch, switch, expected):
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", switch)
    conv3x3 = (3, 3, 1, 1, 1, 1, 1, 1)  # Winograd-eligible, 64 channels: AUTO would time all three
    assert candidate_engines("AUTO", conv3x3, 1, (2, 64, 8, 8), (2, 64, 8, 8), 4, compiled=True) == expected
    assert candidate_engines("WINOGRAD_F2", conv3x3, 1, (2, 64, 8, 8), (2, 64, 8, 8), 4, compiled=True) == (
        "WINOGRAD_F2",)  # a named engine is kept as named


def test_engines_say_whether_they_are_invariant():
    assert {name: cls.batch_invariant for name, cls in ENGINES.items()} == {
        "IM2COL": False, "IMPLICIT": True, "WINOGRAD": False, "WINOGRAD_F2": False}


@pytest.mark.parametrize("k, n", [(9216, 64), (500, 10), (1000, 3)])
def test_matmul_rows_is_row_by_row_under_the_switch(invariant, k, n):
    rs = numpy.random.RandomState(1)
    x, w = rs.randn(33, k).astype(numpy.float32), rs.randn(k, n).astype(numpy.float32)
    whole = blas.matmul_rows(x, w, numpy.empty((33, n), numpy.float32))
    for lo, hi in [(0, 1), (5, 9), (20, 33)]:
        numpy.testing.assert_array_equal(blas.matmul_rows(x[lo:hi], w, numpy.empty((hi - lo, n), numpy.float32)),
                                         whole[lo:hi])
    numpy.testing.assert_allclose(whole, x.astype(numpy.float64) @ w, rtol=1e-4, atol=1e-3)
