"""Weights and solver states are read lazily (layerforge/npz.py): only what the net needs is decompressed, and an
entry whose header does not fit the net, or its own size, is refused before it is read (issue 50)."""
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy
import pytest

from layerforge import Net
from layerforge.errors import LayerforgeError
from layerforge.npz import load_npz

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_load_weights  # noqa: E402


@pytest.fixture(scope="module")
def bombed(tmp_path_factory):
    """A net (8 MiB of parameters) and its weights file with 3 GiB of deflated zeros in an entry it does not use."""
    return bench_load_weights.write_weights(str(tmp_path_factory.mktemp("bomb")), 8, 3 * 2 ** 30)


def test_an_unused_3_gib_entry_costs_neither_time_nor_memory(bombed):
    net_path, weights = bombed
    assert os.path.getsize(weights) < 32 * 2 ** 20  # a small file...
    with zipfile.ZipFile(weights) as z:
        assert z.getinfo("unused/0.npy").file_size > 3 * 2 ** 30  # ...that holds 3 GiB
    result = bench_load_weights.measure_in_child(net_path, weights)  # a fresh process: its own peak RSS
    assert result["params_bytes"] == 8 * 2 ** 20 + 2 * 1024 * 4
    assert result["seconds"] < 10  # reading every entry first took minutes
    assert result["rss_growth_bytes"] < 2 * result["params_bytes"]  # it cost 3.2 GB
    expected = Net(bench_load_weights.net_definition(8), phase="test")
    arrays = load_npz(weights)  # by name: items() would decompress the 3 GiB entry too
    expected.copy_from({k: arrays[k] for k in arrays if not k.startswith("unused")})
    assert result["checksum"] == pytest.approx(
        sum(float(b.data.sum()) for _, blobs in expected.param_keys() for b in blobs))


def test_lookups_read_only_the_entry_asked_for(tmp_path, monkeypatch):
    path = tmp_path / "w.npz"
    numpy.savez(path, a=numpy.arange(6.0).reshape(2, 3), f=numpy.asfortranarray(numpy.arange(6).reshape(2, 3)),
                s=numpy.array("text"), e=numpy.zeros((0, 3), numpy.float32))
    arrays = load_npz(path)
    assert sorted(arrays) == ["a", "e", "f", "s"] and "a" in arrays and "b" not in arrays and len(arrays) == 4
    assert arrays.shape("a") == (2, 3)
    numpy.testing.assert_array_equal(arrays["a"], numpy.arange(6.0).reshape(2, 3))
    numpy.testing.assert_array_equal(arrays["f"], numpy.arange(6).reshape(2, 3))
    assert arrays["s"].item() == "text" and arrays["e"].shape == (0, 3) and arrays["e"].dtype == numpy.float32
    with pytest.raises(KeyError):
        arrays["b"]


def npz_with_header(path, name, shape, data=b"\0" * 16):
    """An .npz whose entry ``name`` has a header declaring ``shape`` (float32) followed by ``data`` alone."""
    from numpy.lib import format as npy

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open(f"{name}.npy", "w") as f:
        npy.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
        f.write(data)


def ip_net():
    return Net({"name": "n", "layers": [
        {"name": "data", "type": "Input", "top": "data", "input": {"shape": [[1, 3]]}},
        {"name": "ip", "type": "InnerProduct", "bottom": "data", "top": "ip",
         "inner_product": {"num_output": 4, "bias_term": False}}]}, phase="test")


def test_an_entry_that_holds_less_than_its_header_declares_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "w.npz"
    npz_with_header(path, "ip/0", (4, 3), b"\0" * 8)
    with pytest.raises(LayerforgeError, match=rf"^{path}: entry 'ip/0': its header declares shape \(4, 3\) of "
                                              rf"float32 \(48 B\) but the entry holds \d+ B; the file is damaged"):
        ip_net().copy_from(str(path))


def test_an_entry_declaring_10_to_the_12_elements_is_never_read(tmp_path):
    path = tmp_path / "w.npz"
    npz_with_header(path, "ip/0", (10 ** 12,))  # 3.6 TiB declared in a file of a few hundred bytes
    with pytest.raises(LayerforgeError, match=rf"^{path}: entry 'ip/0': its header declares shape "
                                              rf"\(1000000000000,\) of float32 \(3,725.3 GiB\) but the entry holds "
                                              rf"144 B; the file is damaged or was not written by numpy$"):
        ip_net().copy_from(str(path))


def test_an_npy_claiming_10_to_the_12_elements_is_one_line_naming_the_file(tmp_path):
    from numpy.lib import format as npy

    path = tmp_path / "w.npy"
    with open(path, "wb") as f:
        npy.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (10 ** 12,)})
        f.write(b"\0" * 64)
    net = tmp_path / "net.yaml"
    net.write_text("name: n\nlayers:\n- {name: data, type: Input, top: data, input: {shape: [[1, 3]]}}\n"
                   "- {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product: {num_output: 4}}\n")
    proc = subprocess.run([sys.executable, "-m", "layerforge", "test", "--model", str(net), "--weights", str(path),
                           "--iterations", "1"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {path}: a single array ((1000000000000,)), not an .npz of named arrays (weights come "
                      f"as .npz from net.save, or .caffemodel)"], proc.stderr


def test_a_solver_state_history_entry_of_another_shape_is_never_read(tmp_path, monkeypatch):
    from layerforge.solvers import get_solver

    keys = {"net_param": {"name": "n", "layers": [
        {"name": "data", "type": "DummyData", "top": ["data", "label"],
         "dummy_data": {"shape": [[2, 3], [2]], "data_filler": [{"type": "gaussian"}, {"type": "constant"}]}},
        {"name": "ip", "type": "InnerProduct", "bottom": "data", "top": "ip", "inner_product": {"num_output": 2}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]},
        "max_iter": 1, "snapshot_prefix": str(tmp_path / "s"), "display": 0, "momentum": 0.9}
    get_solver(keys).solve()
    state = tmp_path / "s_iter_1.solverstate.npz"
    arrays = dict(load_npz(state))
    arrays["history/0"] = numpy.zeros((3, 2), numpy.float32)  # the transposed shape: of another net
    numpy.savez(state, **arrays)
    from layerforge.npz import NpzArrays

    read, real = [], NpzArrays.__getitem__
    monkeypatch.setattr(NpzArrays, "__getitem__", lambda self, key: read.append(key) or real(self, key))
    with pytest.raises(LayerforgeError, match=r"history/0 has shape \(3, 2\), the net's parameter \(2, 3\)"):
        get_solver(keys).restore(str(state))
    assert "history/0" not in read and "iter" in read
