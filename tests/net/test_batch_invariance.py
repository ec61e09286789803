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
    """The switch on with a BLAS that fails blas.canonical_blas (MKL, OpenBLAS's Haswell and Zen cores): thin_gemm
    computes every float32 product. numpy's matmul stands for such a BLAS: its results are scaled by a factor that
    depends on the product's size (a few units in the last place), as another BLAS's rounding depends on the
    shape, so a product that reached it would give an image other bits in another batch."""
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", True)
    monkeypatch.setitem(blas._CANONICAL, "checked", False)
    matmul = numpy.matmul

    def shape_dependent_matmul(a, b, out=None):
        result = matmul(a, b, out=out)
        result *= result.dtype.type(1 + (result.size % 5 + 1) * 2.0 ** -20)
        return result
    monkeypatch.setattr(numpy, "matmul", shape_dependent_matmul)


@pytest.fixture
def canonical(monkeypatch):
    """The switch on with this machine's OpenBLAS, whose large products thin_gemm reproduces (its SkylakeX core; with
    another, such as an AVX2 machine's Haswell core, thin_gemm computes every product: the ``invariant`` fixture's
    tests)."""
    if not blas.canonical_blas():
        pytest.skip("numpy's BLAS is not OpenBLAS's SkylakeX core")
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


@pytest.mark.parametrize("engine", ["AUTO", "IMPLICIT", "IM2COL"])
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
    if engine == "AUTO":  # IM2COL's products too, which cuBLAS would not give an image's bits in any batch
        assert [sorted(layer.engines) for layer in nets[7].layers if layer.type == "Convolution"] == [
            ["IM2COL", "IMPLICIT"]] * 2


@pytest.mark.parametrize("engine", ["WINOGRAD", "WINOGRAD_F2"])
def test_winograds_results_do_not_depend_on_the_batch_with_any_blas(invariant, engine):
    """With a BLAS thin_gemm does not reproduce, Winograd's tile positions' products (the tiles of every image of the
    call as the columns) are thin_gemm's too: an image's y and its gradients are its own in any batch."""
    rs = numpy.random.RandomState(3)
    images = rs.randn(5, 64, 10, 10).astype(numpy.float32)
    nets = {}
    for n in (1, 2, 5):
        d = winograd_net(n)
        for layer in d["layers"][1:]:
            layer.get("convolution", {})["engine"] = engine
        nets[n] = Net(d)
    for n in (1, 2):
        nets[n].share_params_with(nets[5])
    grads = {}
    for n in (5, 1, 2):
        net = nets[n]
        data = images[:n] if n != 2 else images[3:5]
        net.forward(data=data)
        net.blobs["conv2"].diff[...] = rs.randn(*net.blobs["conv2"].shape).astype(numpy.float32) if n == 5 else \
            grads[5][0][:1] if n == 1 else grads[5][0][3:5]
        net.backward()
        grads[n] = (net.blobs["conv2"].diff.copy(), net.blobs["conv2"].data.copy(), net.blobs["data"].diff.copy())
    numpy.testing.assert_array_equal(grads[1][1], grads[5][1][:1])
    numpy.testing.assert_array_equal(grads[2][1], grads[5][1][3:5])
    numpy.testing.assert_array_equal(grads[1][2], grads[5][2][:1])
    numpy.testing.assert_array_equal(grads[2][2], grads[5][2][3:5])


def test_engines_say_whether_they_are_invariant():
    assert {name: cls.batch_invariant for name, cls in ENGINES.items()} == {
        "IM2COL": False, "IMPLICIT": True, "WINOGRAD": False, "WINOGRAD_F2": False}


@pytest.mark.parametrize("k, n", [(9216, 64), (500, 10), (1000, 3), (2048, 300)])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("blas_kind", ["invariant", "canonical"])
def test_matmul_rows_is_row_by_row_under_the_switch(request, blas_kind, k, n, transposed):
    """Row by row, with a BLAS thin_gemm does not reproduce (one product per row) and with this machine's: rows alone,
    4 (thin_gemm), 13 and 16 (blas.SWAP_MIN_ROWS and more: with the weights transposed, as InnerProduct's x W^T, the
    product runs as (W x^T)^T on OpenBLAS's large path) and all 33 give a row the same bits."""
    request.getfixturevalue(blas_kind)
    rs = numpy.random.RandomState(1)
    x, w = rs.randn(33, k).astype(numpy.float32), rs.randn(k, n).astype(numpy.float32)
    if transposed:
        w = numpy.ascontiguousarray(w.T).T
    whole = blas.matmul_rows(x, w, numpy.empty((33, n), numpy.float32))
    assert blas.SWAP_MIN_ROWS <= 13
    for lo, hi in [(0, 1), (5, 9), (20, 33), (1, 17)]:
        numpy.testing.assert_array_equal(blas.matmul_rows(x[lo:hi], w, numpy.empty((hi - lo, n), numpy.float32)),
                                         whole[lo:hi])
    numpy.testing.assert_allclose(whole, x.astype(numpy.float64) @ w, rtol=1e-4, atol=1e-3)


def small_net(batch, phase_engine, num_output=24, spatial=9, kernel=3, pad=1, stride=1):
    filler = {"weight_filler": {"type": "gaussian", "std": 0.1}, "bias_filler": {"type": "constant", "value": 0.1}}
    return {"name": "shapes", "layers": [
        {"name": "data", "type": "Input", "top": "data", "input": {"shape": [batch, 3, spatial, spatial]}},
        {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "conv1", "convolution": dict(
            filler, num_output=num_output, kernel_size=kernel, pad=pad, stride=stride, engine=phase_engine)},
        {"name": "bn", "type": "BatchNorm", "bottom": "conv1", "top": "conv1",
         "batch_norm": {"use_global_stats": True}},
        {"name": "relu1", "type": "ReLU", "bottom": "conv1", "top": "conv1"},
        {"name": "conv2", "type": "Convolution", "bottom": "conv1", "top": "conv2",
         "convolution": dict(filler, num_output=16, kernel_size=1, engine=phase_engine)},
        {"name": "ip", "type": "InnerProduct", "bottom": "conv2", "top": "ip", "inner_product": dict(filler, num_output=10)}]}


@pytest.mark.parametrize("phase", ["train", "test"])
@pytest.mark.parametrize("spatial, kernel, pad, stride", [(9, 3, 1, 1), (7, 7, 0, 1), (7, 3, 0, 1), (31, 5, 2, 2)])
def test_every_layers_output_is_the_same_in_any_batch_with_the_blas_path(canonical, phase, spatial, kernel, pad,
                                                                           stride):
    """Every blob, not only the last: 1x1 outputs (a 7x7 kernel on 7x7: each image's product has one column), 5x5
    outputs, IM2COL and IMPLICIT both tried by AUTO (the first passes), TRAIN and TEST (BatchNorm on its stored
    statistics: with batch statistics an image's output depends on its batch by definition)."""
    rs = numpy.random.RandomState(3)
    images = rs.randn(6, 3, spatial, spatial).astype(numpy.float32) * 20
    nets = {n: Net(small_net(n, "AUTO", spatial=spatial, kernel=kernel, pad=pad, stride=stride), phase=phase)
            for n in (1, 2, 6)}
    nets[6].params["bn"][0].data[...] = rs.rand(nets[6].params["bn"][0].count)
    nets[6].params["bn"][1].data[...] = rs.rand(nets[6].params["bn"][1].count) + 0.5
    nets[6].params["bn"][2].data[...] = 1
    for n in (1, 2):
        nets[n].share_params_with(nets[6])
    for _ in range(4):
        for n, net in nets.items():
            net.forward(data=images[6 - n:])
        for name in ("conv1", "conv2", "ip"):
            whole = nets[6].blobs[name].data
            numpy.testing.assert_array_equal(nets[1].blobs[name].data[0], whole[5], err_msg=name)
            numpy.testing.assert_array_equal(nets[2].blobs[name].data, whole[4:], err_msg=name)
    assert any("IM2COL" in layer.engines for layer in nets[6].layers if layer.type == "Convolution")


@pytest.mark.parametrize("k, n", [(9216, 64), (500, 10), (1000, 3), (800, 500), (147, 64), (4096, 1000)])
def test_products_give_a_row_the_same_bits_in_any_batch(canonical, k, n):
    """x @ W.T (InnerProduct's layout) and x @ B: one row is a GEMV, a few rows OpenBLAS's small kernel, many its
    large path; all three give the same bits under the switch (and not without it, for most of these shapes)."""
    rs = numpy.random.RandomState(1)
    x, w = rs.randn(64, k).astype(numpy.float32), rs.randn(n, k).astype(numpy.float32)
    for b in (w.T, numpy.ascontiguousarray(w.T)):
        whole = blas.matmul(x, b)
        for lo, hi in [(0, 1), (5, 7), (20, 33), (63, 64)]:
            numpy.testing.assert_array_equal(blas.matmul(x[lo:hi], b), whole[lo:hi])
        numpy.testing.assert_allclose(whole, x.astype(numpy.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("a_transposed", [False, True])
@pytest.mark.parametrize("m, k, columns", [(64, 64, 196), (128, 128, 49), (96, 160, 49)])
def test_a_stack_of_products_goes_to_openblas_and_keeps_an_images_bits(canonical, monkeypatch, m, k, columns,
                                                                        a_transposed):
    """F(4,3) Winograd's 36 tile-position products at batch 4 (each (m, k) x (k, 4 x columns), between thin_gemm.SMALL_MNK
    and blas.THIN_MULTIPLY_ADDS multiply-adds): as a stack they go to OpenBLAS, on one thread, where thin_gemm took
    them one by one (the data gradient's transposed a copied per position) at 0.4-0.9 times the speed; one image's
    columns, each product under SMALL_MNK, go to thin_gemm, and get the same bits."""
    from layerforge.kernels import thin_gemm

    rs = numpy.random.RandomState(3)
    a = rs.randn(36, k, m).astype(numpy.float32).swapaxes(1, 2) if a_transposed else \
        rs.randn(36, m, k).astype(numpy.float32)
    b = rs.randn(36, k, 4 * columns).astype(numpy.float32)
    assert thin_gemm.SMALL_MNK < m * k * 4 * columns <= blas.THIN_MULTIPLY_ADDS
    real, seen = thin_gemm.matmul, []
    monkeypatch.setattr(thin_gemm, "matmul", lambda *args, **kw: seen.append(args[1].shape) or real(*args, **kw))
    whole = blas.matmul(a, b, out=numpy.empty((36, m, 4 * columns), numpy.float32))
    assert seen == []
    for image in range(4):
        part = slice(image * columns, (image + 1) * columns)
        numpy.testing.assert_array_equal(blas.matmul(a, numpy.ascontiguousarray(b[:, :, part])), whole[:, :, part])
    assert len(seen) == 4
    numpy.testing.assert_allclose(whole, a.astype(numpy.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False), ("false", False), ("", False)])
def test_batch_invariance_is_on_unless_the_environment_turns_it_off(monkeypatch, value, on):
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", None)  # read again from the environment
    if value is None:
        monkeypatch.delenv("LAYERFORGE_BATCH_INVARIANT", raising=False)
    else:
        monkeypatch.setenv("LAYERFORGE_BATCH_INVARIANT", value)
    assert blas.batch_invariant() is on


def test_without_the_switch_a_row_moves_with_its_batch(monkeypatch):
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", False)
    rs = numpy.random.RandomState(1)
    x, w = rs.randn(64, 4096).astype(numpy.float32), rs.randn(1000, 4096).astype(numpy.float32)
    assert not numpy.array_equal(blas.matmul(x[:1], w.T), blas.matmul(x, w.T)[:1])


def test_im2col_and_implicit_agree_bit_for_bit_with_the_blas_path(canonical):
    rs = numpy.random.RandomState(5)
    images = rs.randn(4, 3, 31, 31).astype(numpy.float32) * 20
    nets = {engine: Net(small_net(4, engine, spatial=31, kernel=5, pad=2, stride=2), phase="test")
            for engine in ("IM2COL", "IMPLICIT")}
    nets["IMPLICIT"].share_params_with(nets["IM2COL"])
    out = {engine: {k: v.copy() for k, v in net.forward(data=images).items()} for engine, net in nets.items()}
    numpy.testing.assert_array_equal(out["IM2COL"]["ip"], out["IMPLICIT"]["ip"])


@pytest.mark.parametrize("canonical_verdict", [True, False])
@pytest.mark.parametrize("switch", [False, True])
def test_the_autotuner_times_every_engine_with_the_blas_path_on_the_cpu(monkeypatch, switch, canonical_verdict):
    """Every engine gives an image the same bits in any batch with the BLAS path (Winograd's tiles are the image's
    own), on the CPU, with OpenBLAS's SkylakeX core or another BLAS (thin_gemm's products then); on a GPU only
    IMPLICIT's tiled kernel does (IM2COL's is cuBLAS's GEMM, and it differs from IMPLICIT's in the last bits: AUTO's
    trials would mix them; the Winograd tile transforms are products over the whole batch)."""
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", switch)
    monkeypatch.setitem(blas._CANONICAL, "checked", canonical_verdict)
    conv3x3 = (3, 3, 1, 1, 1, 1, 1, 1)
    every = ("IM2COL", "IMPLICIT", "WINOGRAD_F2", "WINOGRAD")
    assert candidate_engines("AUTO", conv3x3, 1, (2, 64, 8, 8), (2, 64, 8, 8), 4, compiled=True) == every
    assert candidate_engines("AUTO", conv3x3, 1, (2, 64, 8, 8), (2, 64, 8, 8), 4, compiled=False) == (
        every if not switch else ("IMPLICIT",))
    assert candidate_engines("WINOGRAD_F2", conv3x3, 1, (2, 64, 8, 8), (2, 64, 8, 8), 4, compiled=False) == (
        "WINOGRAD_F2",)  # a named engine is kept as named


def winograd_net(batch, channels=64, spatial=10):
    filler = {"weight_filler": {"type": "msra"}, "bias_filler": {"type": "constant", "value": 0.1}}
    return {"name": "winograd", "layers": [
        {"name": "data", "type": "Input", "top": "data", "input": {"shape": [batch, channels, spatial, spatial]}},
        {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "conv1",
         "convolution": dict(filler, num_output=channels, kernel_size=3, pad=1)},
        {"name": "relu1", "type": "ReLU", "bottom": "conv1", "top": "conv1"},
        {"name": "conv2", "type": "Convolution", "bottom": "conv1", "top": "conv2",
         "convolution": dict(filler, num_output=32, kernel_size=3, pad=1)}]}


@pytest.mark.parametrize("fastest", [{8: "WINOGRAD", 1: "IM2COL", 3: "WINOGRAD_F2"},
                                     {8: "IMPLICIT", 1: "WINOGRAD_F2", 3: "WINOGRAD"}])
def test_the_first_net_to_time_a_convolution_chooses_its_arithmetic_for_every_batch(canonical, monkeypatch,
                                                                                       fastest):
    """AUTO's timings differ with the batch (Winograd wins at large batches, the GEMMs at one image): under the
    switch the first net that times a per-image convolution chooses its arithmetic (GEMM, F(2,3) or F(4,3)), the
    nets of every other batch compute the same, and every counted pass is computed with it (AUTO times on scratch
    arrays first), so an image's outputs are the same bits in any batch from the first pass on. A later run finds
    the choice in the engine cache."""
    from layerforge.kernels import autotune
    batch = {}
    timed = autotune.ConvEngines.run

    def run(self, direction, *args, **kwargs):  # the engine that is "fastest" at this batch takes no time
        if self.tuning[direction].choice is None:
            batch["now"] = args[0].shape[0]
        return timed(self, direction, *args, **kwargs)
    monkeypatch.setattr(autotune.ConvEngines, "run", run)
    monkeypatch.setattr(autotune.AutoChoice, "record", lambda self, name, seconds, record=autotune.AutoChoice.record:
                        record(self, name, 0.0 if name == fastest[batch["now"]] else 1.0))
    rs = numpy.random.RandomState(7)
    images = rs.randn(8, 64, 10, 10).astype(numpy.float32)
    nets = {8: Net(winograd_net(8), phase="test")}
    for n in (1, 3):
        nets[n] = Net(winograd_net(n), phase="test")
        nets[n].share_params_with(nets[8])
    for _ in range(2):
        out = {n: nets[n].forward(data=images[8 - n:])["conv2"].copy() for n in (8, 1, 3)}
        assert out[1].tobytes() == out[8][7:].tobytes()
        assert out[3].tobytes() == out[8][5:].tobytes()
    sums = autotune.arithmetic(fastest[8])
    for n, net in nets.items():
        assert [autotune.arithmetic(layer.engine_choice["forward"]) for layer in net.layers[1:4:2]] == [sums] * 2
    assert len(autotune._SHARED_FORWARD) == 2  # conv1 and conv2
    monkeypatch.setattr(autotune, "_SHARED_FORWARD", {})  # a later run: the engine cache has the choice
    again = Net(winograd_net(1), phase="test")
    again.share_params_with(nets[8])
    assert again.forward(data=images[7:])["conv2"].tobytes() == out[1].tobytes()


@pytest.mark.parametrize("k, n", [(500, 10), (800, 500), (4096, 1000)])
def test_the_emulated_gpu_gives_a_row_the_same_bits_in_any_batch_and_the_cpus(canonical, k, n):
    """The emulated device's GEMM is the host's OpenBLAS on its threads: each element the large path's FMA chains
    as OpenBLAS cuts the sum on that many threads, which is the CPU's result (one BLAS thread under the switch)
    wherever the two cuts agree (800 and 4096, not 500: 250 + 250 against 256 + 244)."""
    from threadpoolctl import threadpool_info

    from layerforge.kernels import thin_gemm
    from tests.conftest import REAL_GPU

    if REAL_GPU:
        pytest.skip("cuBLAS chooses its kernels by the shapes: only the emulated device's GEMM is the host's")
    import cupy

    from layerforge.backend import to_numpy
    rs = numpy.random.RandomState(2)
    x, w = rs.randn(64, k).astype(numpy.float32), rs.randn(n, k).astype(numpy.float32)
    gx, gw = cupy.asarray(x), cupy.asarray(w)
    whole = to_numpy(blas.matmul(gx, gw.T))
    for lo, hi in [(0, 1), (5, 7), (63, 64)]:
        numpy.testing.assert_array_equal(to_numpy(blas.matmul(gx[lo:hi], gw.T)), whole[lo:hi])
    threaded = max(i["num_threads"] for i in threadpool_info() if "numpy" in i["filepath"]) > 1
    numpy.testing.assert_array_equal(whole, thin_gemm.matmul(x, w.T, threaded=threaded))
    if thin_gemm.k_blocks(k, threaded) == thin_gemm.k_blocks(k, False):
        numpy.testing.assert_array_equal(whole, blas.matmul(x, w.T))
    acc = cupy.ones((1, n), cupy.float32)
    blas.add_matmul(acc, gx[:1], gw.T)
    numpy.testing.assert_array_equal(to_numpy(acc), 1 + whole[:1])


def test_every_layers_output_is_the_same_in_any_batch_on_the_emulated_gpu(canonical):
    from tests.conftest import REAL_GPU

    if REAL_GPU:
        pytest.skip("cuBLAS chooses its kernels by the shapes: only the emulated device's GEMM is the host's")
    import cupy

    from layerforge.backend import to_numpy
    rs = numpy.random.RandomState(3)
    images = rs.randn(4, 3, 9, 9).astype(numpy.float32) * 20
    nets = {n: Net(small_net(n, "AUTO"), phase="train", xp=cupy) for n in (1, 4)}
    nets[1].share_params_with(nets[4])
    for _ in range(3):  # AUTO's trials
        for n, net in nets.items():
            net.blobs["data"].data[...] = cupy.asarray(images[4 - n:])
            net.forward()
        for name in ("conv1", "conv2", "ip"):
            numpy.testing.assert_array_equal(to_numpy(nets[1].blobs[name].data)[0],
                                             to_numpy(nets[4].blobs[name].data)[3], err_msg=name)


def test_the_benchmarks_layer_by_layer_ab_times_every_layer_in_both_modes(monkeypatch):
    """benchmarks/bench_batch_invariance.py --layers: one net per mode, each settled under its own mode, every
    layer's forward timed in both."""
    import os
    import sys
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", blas.batch_invariant())  # restored after the toggling
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    monkeypatch.delitem(sys.modules, "bench_batch_invariance", raising=False)
    import bench_batch_invariance
    rows = bench_batch_invariance.layers_in_process("lenet", 2, 3, on_first=True)
    assert [name for name, _, _ in rows] == ["data", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2",
                                             "loss", "(the pass)"]
    assert all(off > 0 and on > 0 for _, off, on in rows)
    assert rows[-1][1] >= max(off for _, off, _ in rows[:-1])


def _openblas_threads():
    return blas._openblas_control()[0]()


class _CountingThreads(numpy.ndarray):
    # an array whose products note how many threads OpenBLAS would share them over
    seen = []

    def __matmul__(self, other):
        _CountingThreads.seen.append(_openblas_threads())
        return numpy.asarray(self) @ other


@pytest.mark.skipif(not blas.one_blas_thread().available, reason="numpy's BLAS is not an OpenBLAS whose threads can be set")
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_row_sums_run_on_the_calling_thread(monkeypatch, dtype):
    """blas.row_sums (the bias and scale gradients' GEMV against ones) keeps OpenBLAS on the calling thread: a product
    OpenBLAS shares leaves its threads spinning on the cores the kernel threads' products take next (AlexNet's conv2
    backward 107 ms instead of 75). The sums are the GEMV's."""
    before = _openblas_threads()
    blas._openblas_control()[1](2)
    try:
        a = numpy.random.RandomState(0).randn(300, 729).astype(dtype)
        _CountingThreads.seen = []
        sums = blas.row_sums(a.view(_CountingThreads))
        assert _CountingThreads.seen == [1] and _openblas_threads() == 2
        numpy.testing.assert_array_equal(numpy.asarray(sums), a @ numpy.ones(729, dtype))
        numpy.testing.assert_allclose(numpy.asarray(sums), a.astype(numpy.float64).sum(axis=1), rtol=1e-5, atol=1e-3)
    finally:
        blas._openblas_control()[1](before)


@pytest.mark.skipif(not blas.one_blas_thread().available, reason="numpy's BLAS is not an OpenBLAS whose threads can be set")
def test_one_blas_thread_nests_and_puts_the_count_back_when_the_last_context_closes(monkeypatch):
    import threading

    before = _openblas_threads()
    blas._openblas_control()[1](2)
    try:
        inner_open, outer_may_close = threading.Event(), threading.Event()
        seen = []

        def other():  # a context in another thread that outlives the main thread's
            with blas.one_blas_thread():
                inner_open.set()
                outer_may_close.wait(10)
                seen.append(_openblas_threads())
            seen.append(_openblas_threads())
        thread = threading.Thread(target=other)
        with blas.one_blas_thread():
            thread.start()
            inner_open.wait(10)
            with blas.one_blas_thread():
                assert _openblas_threads() == 1
            assert _openblas_threads() == 1
        assert _openblas_threads() == 1  # the other thread's context is still open
        outer_may_close.set()
        thread.join(10)
        assert seen == [1, 2]
        assert _openblas_threads() == 2
    finally:
        blas._openblas_control()[1](before)


@pytest.mark.parametrize("shape_a, shape_b, accumulate", [
    ((70, 600), (600, 900), False),  # columns split, the summed axis cut in two unequal halves on one thread
    ((900, 600), (600, 70), False),  # rows
    ((7, 40, 300), (300, 130), False),  # a stack: matrices split, b broadcast
    ((3, 70, 600), (600, 130), False),  # a stack of products larger than thin_gemm takes (blas.THIN_MULTIPLY_ADDS)
    ((500, 50), (50, 640), False),  # rows: out is less than twice as wide as high
    ((1, 64, 2001), (1, 2001, 400), False),  # one matrix behind an axis of one
    ((64, 3), (3, 900), True),  # a weight gradient's outer product, accumulated in place (cblas_sgemm)
    ((130, 600), (600, 700), True)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_large_products_split_over_the_kernel_threads_give_numpys_bits_on_one_blas_thread(
        canonical, monkeypatch, shape_a, shape_b, accumulate, threads):
    """Under the switch a large product runs on one BLAS thread, split by matrices, columns or rows over the kernel
    threads (here from 1M multiply-adds on, so that these shapes split); each element is the FMA chain that one BLAS
    thread computes for the whole product."""
    from layerforge.kernels import threadpool

    monkeypatch.setattr(blas, "SPLIT_MULTIPLY_ADDS", 1 << 20)
    monkeypatch.setitem(threadpool._state, "threads", threads)
    rs = numpy.random.RandomState(4)
    a, b = rs.randn(*shape_a).astype(numpy.float32), rs.randn(*shape_b).astype(numpy.float32)
    with blas.one_blas_thread():
        expected = numpy.matmul(a, b)
    if accumulate:
        c = numpy.full(expected.shape, 0.5, numpy.float32)
        blas.add_matmul(c, a, b)
        numpy.testing.assert_allclose(c, 0.5 + a.astype(numpy.float64) @ b, rtol=1e-5, atol=1e-4)
        monkeypatch.setattr(blas, "PIECE_BYTES", 4096)  # a BLAS without cblas_sgemm: pieces with temporaries
        monkeypatch.setitem(blas._CANONICAL, "control", blas._openblas_control()[:2] + (None,))
        c = numpy.full(expected.shape, 0.5, numpy.float32)
        blas.add_matmul(c, a, b)
        numpy.testing.assert_array_equal(c, 0.5 + expected)
    else:
        numpy.testing.assert_array_equal(blas.matmul(a, b), expected)
        numpy.testing.assert_array_equal(blas.matmul(a[..., :1, :], b), expected[..., :1, :])  # one row: thin_gemm


@pytest.mark.skipif(not blas.canonical_blas(), reason="numpy's BLAS is not OpenBLAS's SkylakeX core, whose every "
                    "element is one chain whatever its place in the product")
@pytest.mark.parametrize("axis", ["rows", "columns"])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("pieces", [2, 3])
@pytest.mark.parametrize("transposed", [False, True])
def test_sgemm_jobs_cut_one_product_into_pieces_with_one_blas_threads_bits(axis, order, pieces, transposed):
    """blas._sgemm_jobs cuts a product into cblas_sgemm calls on rows or columns of out, in either layout of out
    (F: c^T = b^T a^T) and of a; each piece computes its elements as the whole product on one BLAS thread does. A
    column cut lands on a cache line of every row of out (two threads writing one line take turns for it)."""
    from layerforge.kernels import threadpool

    rs = numpy.random.RandomState(5)
    a, b = rs.randn(96, 700).astype(numpy.float32), rs.randn(700, 330).astype(numpy.float32)
    a = numpy.ascontiguousarray(a.T).T if transposed else a
    with blas.one_blas_thread():
        expected = numpy.matmul(a, b)
    buffer = numpy.empty(96 * 336 + 32, numpy.float32)  # out's rows 336 floats apart, starting off a cache line
    start = (16 - buffer.ctypes.data % 64 // 4) % 16 + 3
    out = buffer[start:start + 96 * 336].reshape(96, 336)[:, :330] if order == "C" else \
        numpy.empty((330, 96), numpy.float32).T
    jobs = blas._sgemm_jobs(a[None], b[None], out[None], False, pieces, axis)
    assert len(jobs) == pieces
    pj = threadpool.product_jit()
    if order == "C" and axis == "columns":
        assert all(job[pj.C] % 64 == 0 for job in jobs[1:])
    with blas.one_blas_thread():
        for job in jobs:
            pj.execute(job)
    numpy.testing.assert_array_equal(out, expected)


@pytest.mark.skipif(not blas.one_blas_thread().available, reason="numpy's BLAS is not an OpenBLAS whose threads can be set")
@pytest.mark.parametrize("switch", [False, True])
def test_a_nets_passes_run_blas_on_one_thread_under_the_switch(monkeypatch, switch):
    """OpenBLAS's threads spin after each product they share, on the cores the kernel threads need: under the
    switch a net's forward and backward passes keep them out, and the count is as it was after."""
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", switch)
    before = _openblas_threads()
    blas._openblas_control()[1](2)
    try:
        net = Net(small_net(2, "IM2COL"), phase="train")
        counts = []
        net.add_hooks(before_forward=lambda i: counts.append(_openblas_threads()),
                      before_backward=lambda i: counts.append(_openblas_threads()))
        net.forward_backward()
        assert set(counts) == ({1} if switch else {2})
        assert _openblas_threads() == 2
    finally:
        blas._openblas_control()[1](before)
