"""Bad configs are refused with one line naming the file (and line), a non-zero exit and no traceback,
within seconds and bounded memory; values a Python caller hands in as numpy scalars are accepted."""
import os
import pathlib
import re
import subprocess
import sys

import numpy
import pytest

from layerforge import Net
from layerforge.cores import THREAD_VARS
from layerforge.errors import ConfigError
from layerforge.schema import MAX_YAML_NODES, load_yaml_text

ROOT = pathlib.Path(__file__).resolve().parents[1]
INPUT = "- {name: data, type: Input, top: data, input: {shape: [[1, 3]]}}\n"


def alias_bomb(levels=12, width=9):
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


BAD_YAML = {
    "alias_bomb": (alias_bomb(), "expands to more than"),
    "alias_bomb_in_a_block": ("name: x\nblocks:\n  b:\n    junk:\n"
                              + "".join("      " + line + "\n" for line in alias_bomb().splitlines())
                              + "layers: []\n", "expands to more than"),
    "deep_nesting": ("name: x\nlayers: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    "nul_byte": ("name: x\x00\nlayers: []\n", "#x0000 is not allowed"),
    "complex_key": ("name: x\n? [a, b]\n: c\nlayers: []\n", "mapping key must be a plain value"),
    "nan_value": ("name: x\nlayers:\n" + INPUT
                  + "- {name: r, type: ReLU, bottom: data, top: r, relu: {negative_slope: .nan}}\n",
                  "expected a finite number, got nan"),
    "inf_value": ("name: x\nlayers:\n" + INPUT
                  + "- {name: r, type: ELU, bottom: data, top: r, elu: {alpha: -.inf}}\n",
                  "expected a finite number, got -inf"),
    "huge_repeat": ("name: x\nblocks:\n  b:\n    layers:\n"
                    "      - {name: '${name}', type: ReLU, bottom: '${bottom}', top: '${name}'}\n"
                    "layers:\n" + INPUT + "- {block: b, name: 'r${i}', repeat: 1000000000000}\n",
                    "more than the 100,000 layers"),
    "nested_repeats": ("name: x\nblocks:\n  b:\n    layers:\n"
                       "      - {name: '${name}', type: ReLU, bottom: '${bottom}', top: '${name}'}\n"
                       "  c:\n    layers:\n      - {block: b, name: '${name}_${i}', repeat: 1000}\n"
                       "layers:\n" + INPUT + "- {block: c, name: 'r${i}', repeat: 1000}\n",
                       "expands to more than 100,000 layers"),
    "huge_expression": ("name: x\nblocks:\n  b:\n    params: {k: 3}\n    layers:\n"
                        "      - {name: '${name}', type: ReLU, bottom: '${bottom}', top: '${name}', "
                        "relu: {negative_slope: '${" + "+".join(["k"] * 20000) + "}'}}\n"
                        "layers:\n" + INPUT + "- {block: b, name: 'r${i}', repeat: 2}\n",
                        "too deeply nested"),
    "huge_value": ("name: x\nblocks:\n  b:\n    params: {k: 1000000}\n    layers:\n"
                   "      - {name: '${name}', type: ReLU, bottom: '${bottom}', top: '${name}', "
                   "relu: {negative_slope: '${" + "*".join(["k"] * 12) + "}'}}\n"
                   "layers:\n" + INPUT + "- {block: b, name: 'r${i}'}\n",
                   "larger than"),
    "no_layers": ("name: x\nlayers: []\n", "the net has no layers in the TRAIN or TEST phase"),
    "huge_num_output": ("name: x\nlayers:\n" + INPUT
                        + "- {name: ip, type: InnerProduct, bottom: data, top: ip, "
                        "inner_product: {num_output: 1000000000000}}\n", "GiB of memory available"),
    "huge_input": ("name: x\nlayers:\n- {name: data, type: Input, top: data, "
                   "input: {shape: [[1000000, 1000000, 1000]]}}\n", "GiB of memory available"),
    "huge_kernel": ("name: x\nlayers:\n- {name: data, type: Input, top: data, input: {shape: [[1, 3, 8, 8]]}}\n"
                    "- {name: c, type: Convolution, bottom: data, top: c, "
                    "convolution: {num_output: 4, kernel_size: 1000000000, pad: 500000000}}\n",
                    "GiB of memory available"),
}


@pytest.mark.parametrize("case", sorted(BAD_YAML))
def test_bad_config_is_one_line_and_nonzero_exit(tmp_path, case):
    text, message = BAD_YAML[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "layerforge", "check", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {path}"), lines[0]
    assert message in lines[0]
    assert len(lines[0]) < 400  # never an echo of the whole expression


def test_alias_expansion_limit_counts_shared_nodes_once_per_use():
    # 3 levels of 10 aliases = 1 + 10 + 100 + 1000 scalars and lists: accepted; the bound is on the expansion
    small = "a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nb: &b [" + ", ".join(["*a"] * 10) + "]\n" \
            "c: [" + ", ".join(["*b"] * 10) + "]\n"
    assert len(load_yaml_text(small)["c"]) == 10
    with pytest.raises(ConfigError, match="expands to more than"):
        load_yaml_text(alias_bomb(levels=8, width=8))  # 8^8 = 16.7M > MAX_YAML_NODES
    assert 8 ** 8 > MAX_YAML_NODES


def test_alias_bomb_names_the_line_where_it_passes_the_bound():
    # 9 levels of 9 aliased lists as an Input shape: level 6 is the first to stand for more than the bound
    # (9^7 values against 9^6), so its line is the one named, as for every other YAML error
    levels = [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}' if i else '1'] * 9)}]" for i in range(9)]
    text = "\n".join(levels) + "\nname: x\nlayers:\n- {name: data, type: Input, top: data, input: {shape: [*a8]}}\n"
    assert 9 ** 6 < MAX_YAML_NODES < 9 ** 7
    with pytest.raises(ConfigError, match="expands to more than") as e:
        load_yaml_text(text, "bomb.yaml")
    assert str(e.value).startswith("bomb.yaml:7:")
    block = BAD_YAML["alias_bomb_in_a_block"][0]  # the bomb indented under blocks: b: junk:, four lines down
    with pytest.raises(ConfigError) as e:
        load_yaml_text(block, "block.yaml")
    assert str(e.value).startswith("block.yaml:11:")


def test_nul_byte_names_its_line():
    with pytest.raises(ConfigError) as e:
        load_yaml_text("name: x\nlayers: []\nbad: a\x00b\n", "net.yaml")
    assert str(e.value).startswith("net.yaml:3:")


def test_numpy_scalars_in_a_python_dict_config():
    net = Net({"name": "n", "layers": [
        {"name": "data", "type": "Input", "top": "data", "input": {"shape": [[numpy.int64(2), numpy.int32(3)]]}},
        {"name": "ip", "type": "InnerProduct", "bottom": "data", "top": "ip",
         "inner_product": {"num_output": numpy.int64(4), "bias_term": numpy.bool_(False)}},
        {"name": "r", "type": "ReLU", "bottom": "ip", "top": "ip", "relu": {"negative_slope": numpy.float32(0.5)}},
    ]})
    assert net.blobs["ip"].data.shape == (2, 4)
    assert len(net.params["ip"]) == 1


def test_numpy_float_that_is_not_an_integer_is_refused_for_an_int_key():
    with pytest.raises(ConfigError, match="expected an integer, got 2.5"):
        Net({"name": "n", "layers": [
            {"name": "data", "type": "Input", "top": "data", "input": {"shape": [[2, 3]]}},
            {"name": "ip", "type": "InnerProduct", "bottom": "data", "top": "ip",
             "inner_product": {"num_output": numpy.float64(2.5)}}]})


def test_wrong_array_given_to_a_parameter_names_the_layer():
    from layerforge.errors import ShapeError

    net = Net({"name": "n", "layers": [
        {"name": "data", "type": "Input", "top": "data", "input": {"shape": [[2, 3]]}},
        {"name": "ip", "type": "InnerProduct", "bottom": "data", "top": "ip", "inner_product": {"num_output": 4}}]})
    weights = net.params["ip"][0]
    with pytest.raises(ShapeError, match=r"layer 'ip' parameter 0 of shape \(4, 3\) \(float32\) a data array of "
                                         r"shape \(3, 4\)"):
        weights.data = numpy.zeros((3, 4), numpy.float32)
    with pytest.raises(ShapeError, match=r"\(float64\)"):
        weights.diff = numpy.zeros((4, 3))  # the right shape in the wrong dtype would change the net's precision
    weights.data = numpy.full((4, 3), 0.5, numpy.float32)  # the right array is taken as it is
    assert net.forward(data=numpy.ones((2, 3)))["ip"].sum() == pytest.approx(2 * 4 * 1.5)


@pytest.mark.parametrize("layer,line,message", [
    ("- {name: r, type: ReLU, bottom: data, top: r, loss_weight: .nan}", 4, "key 'loss_weight': expected a finite"),
    ("- name: ip\n  type: InnerProduct\n  bottom: data\n  top: ip", 4, "key 'inner_product.num_output': required"),
    ("- name: ip\n  type: InnerProduct\n  bottom: data\n  top: ip\n  inner_product: {bias_term: false}", 8,
     "key 'inner_product.num_output': required"),
])
def test_errors_in_common_keys_and_missing_keys_name_a_line(tmp_path, layer, line, message):
    path = tmp_path / "net.yaml"
    path.write_text("name: x\nlayers:\n" + INPUT + layer + "\n")
    with pytest.raises(ConfigError) as e:
        Net(str(path))
    assert str(e.value).startswith(f"{path}:{line}: ") and message in str(e.value), str(e.value)


def test_a_full_disk_keeps_the_earlier_file_and_says_so(tmp_path):
    import errno

    from layerforge.errors import LayerforgeError
    from layerforge.npz import load_npz, save_npz_atomic, write_atomic

    path = tmp_path / "w.npz"
    save_npz_atomic(path, {"a": numpy.arange(3.0)})

    def full(f):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(LayerforgeError, match=r"w.npz: cannot write: No space left on device; any earlier file"):
        write_atomic(path, full)
    numpy.testing.assert_array_equal(load_npz(str(path))["a"], numpy.arange(3.0))
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]  # no temporary file left behind


def two_cores():
    """This test's environment (its own engine cache, conftest's folders) with two cores: --cpu-parallel REPLICAS
    starts 2 replicas."""
    return dict(os.environ, **{name: "2" for name in THREAD_VARS})


@pytest.mark.parametrize("prefix,message,cpu_parallel", [("afile/snap/lenet", "Not a directory", []),
                                                         ("/proc/lenet", "No such file or directory", []),
                                                         pytest.param("/proc/lenet", "No such file or directory",
                                                                      ["--cpu-parallel", "REPLICAS"], id="replicas")])
def test_an_unwritable_snapshot_prefix_stops_training_before_it_starts(tmp_path, prefix, message, cpu_parallel):
    from tests.test_train_cli import SOLVER

    (tmp_path / "afile").write_text("")
    solver = tmp_path / "solver.yaml"
    solver.write_text(SOLVER.format(net=ROOT / "configs" / "lenet.yaml", max_iter=2, snapshot=1,
                                    prefix=prefix if prefix.startswith("/") else tmp_path / prefix))
    proc = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", str(solver), *cpu_parallel],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, env=two_cores())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {solver}: snapshot_prefix") and message in last
    assert "Iteration 0" not in proc.stderr


def test_a_truncated_lmdb_is_one_line_not_sigbus(tmp_path):
    import os

    from layerforge.data.lmdb_io import encode_record, write_lmdb_atomic

    db = tmp_path / "db"
    write_lmdb_atomic(db, (encode_record(numpy.full((1, 28, 28), i % 256, numpy.uint8), i % 10) for i in range(2000)))
    mdb = db / "data.mdb"
    with open(mdb, "r+b") as f:
        f.truncate(os.path.getsize(mdb) // 3)
    script = ("from layerforge.data.lmdb_io import LMDBReader\n"
              f"r = LMDBReader({str(db)!r})\n"
              "print(sum(int(r.read(i)[1]) for i in range(len(r))))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.returncode != -7  # a Python error, not a crash by SIGBUS
    assert f"DataError: {db}: the LMDB database is truncated: data.mdb has" in proc.stderr


def test_check_lists_every_layer_problem(tmp_path):
    path = tmp_path / "net.yaml"
    path.write_text("name: x\nlayers:\n" + INPUT
                    + "- {name: a, type: ReLU, bottom: data, top: a, relu: {negative_slop: 1}}\n"
                    + "- {name: b, type: InnerProduct, bottom: a, top: b}\n"
                    + "- {name: c, type: Frobnicate, bottom: b, top: c}\n")
    proc = subprocess.run([sys.executable, "-m", "layerforge", "check", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert [line.split(": ", 2)[1] for line in lines] == [f"{path}:4", f"{path}:5", f"{path}:6"]
    assert "negative_slop" in lines[0] and "num_output" in lines[1] and "Frobnicate" in lines[2]


def test_a_single_npy_given_as_weights_is_one_line(tmp_path):
    from layerforge.errors import LayerforgeError
    from layerforge.npz import load_npz

    numpy.save(tmp_path / "w.npy", numpy.zeros(3))
    with pytest.raises(LayerforgeError, match=r"w.npy: a single array \(\(3,\)\), not an .npz of named arrays"):
        load_npz(tmp_path / "w.npy")


def test_errors_in_an_inline_net_name_the_solver_file_and_line(tmp_path):
    from layerforge.solvers import get_solver

    path = tmp_path / "solver.yaml"
    path.write_text("base_lr: 0.1\nmax_iter: 1\nnet_param:\n  name: x\n  layers:\n"
                    "  - {name: d, type: Input, top: d, input: {shape: [[1, 2]]}}\n"
                    "  - {name: r, type: ReLU, bottom: d, top: r, relu: {negative_slop: 1}}\n")
    with pytest.raises(ConfigError) as e:
        get_solver(str(path))
    assert str(e.value).startswith(f"{path}:7: layer 'r' (ReLU): key 'relu.negative_slop'")


def test_a_label_out_of_range_names_its_record(tmp_path):
    from layerforge.data.lmdb_io import encode_record, write_lmdb_atomic
    from layerforge.errors import DataError

    db = tmp_path / "db"
    write_lmdb_atomic(db, (encode_record(numpy.full((1, 4, 4), i, numpy.uint8), 12 if i == 5 else i % 3)
                           for i in range(8)))
    net = Net({"name": "n", "layers": [
        {"name": "data", "type": "Data", "top": ["data", "label"],
         "data": {"source": str(db), "batch_size": 8, "shuffle": True}},
        {"name": "ip", "type": "InnerProduct", "bottom": "data", "top": "ip", "inner_product": {"num_output": 3}},
        {"name": "acc", "type": "Accuracy", "bottom": ["ip", "label"], "top": "acc"},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]}, phase="train")
    with pytest.raises(DataError) as e:
        net.forward()
    assert str(e.value).endswith(f": it comes from {db}: key '00000005'"), str(e.value)
    assert "label 12" in str(e.value)


def test_a_replica_names_a_bad_label_as_one_process_does(tmp_path):
    """Replica 1 of 2 holds samples 1, 3, 5, ... of the batch: its report gives the whole batch's index."""
    from layerforge.data.lmdb_io import encode_record, write_lmdb_atomic
    from layerforge.errors import DataError

    db = tmp_path / "db"
    write_lmdb_atomic(db, (encode_record(numpy.full((1, 2, 2), i, numpy.uint8), 12 if i == 13 else i % 3)
                           for i in range(16)))
    said = []
    for split in (None, (1, 2)):
        net = Net({"name": "n", "layers": [
            {"name": "data", "type": "Data", "top": ["data", "label"], "data": {"source": str(db), "batch_size": 8,
                                                                                     "shuffle": False}},
            {"name": "ip", "type": "InnerProduct", "bottom": "data", "top": "ip", "inner_product": {"num_output": 3}},
            {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]},
            phase="train", split=split, shard=split)
        net.forward()
        with pytest.raises(DataError) as e:
            net.forward()
        said.append(str(e.value))
    assert said[0] == said[1]
    assert "label 12 at index (5,) of the label blob" in said[0] and said[0].endswith("key '00000013'")


def test_data_and_transform_errors_name_the_net_file_and_layer_line(tmp_path):
    from layerforge.data.lmdb_io import encode_record, write_lmdb_atomic
    from layerforge.errors import DataError

    write_lmdb_atomic(tmp_path / "db", (encode_record(numpy.zeros((1, 4, 4), numpy.uint8), 0) for _ in range(4)))
    path = tmp_path / "net.yaml"
    path.write_text(f"name: x\nlayers:\n- name: d\n  type: Data\n  top: [data, label]\n"
                    f"  data: {{source: {tmp_path / 'db'}, batch_size: 2}}\n  transform: {{crop_size: 9}}\n")
    with pytest.raises(DataError) as e:
        Net(str(path))
    assert str(e.value).startswith(f"{path}:3: layer 'd' (Data): transform.crop_size 9 is larger than the images")


def test_training_refuses_to_start_when_the_nets_need_more_than_the_machine(monkeypatch):
    import os

    from layerforge.errors import LayerforgeError
    from layerforge.solvers import get_solver

    solver = get_solver({"net_param": {"name": "n", "layers": [
        {"name": "data", "type": "Input", "top": "data", "input": {"shape": [[64, 1000]]}},
        {"name": "ip", "type": "InnerProduct", "bottom": "data", "top": "ip", "inner_product": {"num_output": 1000}},
        {"name": "loss", "type": "Reduction", "bottom": "ip", "top": "loss", "loss_weight": 1}]}, "max_iter": 1})
    solver.check_memory()  # a few MiB: fine
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 1024 if name == "SC_PHYS_PAGES" else real(name))
    with pytest.raises(LayerforgeError, match=r"the nets need .* MiB of memory .* more than this machine's"):
        solver.check_memory()


@pytest.mark.parametrize("field,value,message", [
    ("rng", "not json", "field 'rng' is malformed"),
    ("rng", '{"bit_generator": "MT19937"}', "field 'rng' is malformed"),
    ("data_state", "{", "field 'data_state' is malformed"),
    ("data_state", '{"train": {"d": "x"}}', "the saved state of layer 'd' (train net) is malformed"),
    ("iter", "abc", "field 'iter' is malformed"),
    ("losses", ["x"], "field 'losses' is malformed"),
    ("rng", None, "has no 'rng'"),
])
def test_malformed_solver_states_are_one_line(tmp_path, field, value, message):
    from layerforge.data.lmdb_io import encode_record, write_lmdb_atomic
    from layerforge.errors import LayerforgeError
    from layerforge.solvers import get_solver

    write_lmdb_atomic(tmp_path / "db", (encode_record(numpy.zeros((1, 2, 2), numpy.uint8), 0) for _ in range(4)))
    net = {"name": "n", "layers": [
        {"name": "d", "type": "Data", "top": ["data", "label"], "data": {"source": str(tmp_path / "db"), "batch_size": 2}},
        {"name": "ip", "type": "InnerProduct", "bottom": "data", "top": "ip", "inner_product": {"num_output": 2}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]}
    keys = {"net_param": net, "max_iter": 1, "snapshot_prefix": str(tmp_path / "s"), "display": 0}
    solver = get_solver(keys)
    solver.solve()
    state = tmp_path / "s_iter_1.solverstate.npz"
    arrays = dict(numpy.load(state))
    if value is None:
        del arrays[field]
    else:
        arrays[field] = numpy.array(value)
    numpy.savez(state, **arrays)
    with pytest.raises(LayerforgeError, match=re.escape(message)):
        get_solver(keys).restore(str(state))


def empty_source(tmp_path, kind):
    """The first layer (YAML) of a net whose data is 0x0x0 per item, written as ``kind`` says."""
    from layerforge.data.datum import array_to_datum
    from layerforge.data.lmdb_io import encode_record, write_lmdb_atomic

    empty = numpy.zeros((0, 0, 0), numpy.uint8)
    if kind in ("lfr1", "datum"):
        encode = encode_record if kind == "lfr1" else lambda a, label: array_to_datum(a, label).SerializeToString()
        write_lmdb_atomic(tmp_path / "db", (encode(empty, i % 2) for i in range(4)))
        return f"- {{name: data, type: Data, top: [data, label], data: {{source: {tmp_path / 'db'}, batch_size: 2}}}}\n"
    if kind == "hdf5":
        import h5py

        with h5py.File(tmp_path / "d.h5", "w") as f:
            f["data"], f["label"] = numpy.zeros((4, 0, 0, 0)), numpy.zeros(4)
        (tmp_path / "list.txt").write_text(f"{tmp_path / 'd.h5'}\n")
        return (f"- {{name: data, type: HDF5Data, top: [data, label], "
                f"hdf5_data: {{source: {tmp_path / 'list.txt'}, batch_size: 2}}}}\n")
    return ("- {name: data, type: DummyData, top: [data, label], "
            "dummy_data: {shape: [[2, 0, 0, 0], [2]], data_filler: [{type: constant}]}}\n")


EMPTY_RECORDS = {  # source kind -> what the one line says
    "lfr1": "layer 'data' (Data): {tmp}/db: key '00000000': corrupted record: its shape 0x0x0 holds no values",
    "datum": "layer 'data' (Data): {tmp}/db: key '00000000': the Datum's shape 0x0x0 holds no values",
    "hdf5": "layer 'data' (HDF5Data): hdf5_data.source '{tmp}/list.txt': {tmp}/d.h5: dataset 'data' has rows of "
            "shape (0, 0, 0), which hold no values",
    "dummy": "layer 'ip' (InnerProduct): its parameter would have shape (2, 0), with no values: an input of this "
             "layer is empty (bottoms: 'data' (2, 0, 0, 0) from layer 'data')",
}


# time and train build the net as check does (train's replicas too): one source kind shows them
@pytest.mark.parametrize("kind, command", [(kind, "check") for kind in sorted(EMPTY_RECORDS)]
                         + [("lfr1", "time"), ("lfr1", "train"), ("lfr1", "replicas")])
def test_a_record_of_shape_0x0x0_is_one_line_naming_the_layer_and_record(tmp_path, kind, command):
    net = tmp_path / "net.yaml"
    net.write_text("name: empty\nlayers:\n" + empty_source(tmp_path, kind)
                   + "- {name: ip, type: InnerProduct, bottom: data, top: ip, "
                     "inner_product: {num_output: 2, weight_filler: {type: xavier}}}\n"
                   + "- {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    (tmp_path / "solver.yaml").write_text(f"net: {net}\nbase_lr: 0.1\nmax_iter: 2\nsnapshot: 0\n")
    args = {"check": ["check", str(net)], "time": ["time", "--model", str(net), "--iterations", "1"],
            "train": ["train", "--solver", str(tmp_path / "solver.yaml")],
            "replicas": ["train", "--solver", str(tmp_path / "solver.yaml"), "--cpu-parallel", "REPLICAS"]}[command]
    proc = subprocess.run([sys.executable, "-m", "layerforge"] + args, capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=two_cores())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line = 4 if kind == "dummy" else 3
    said = proc.stderr.strip().splitlines()
    if command == "replicas":  # after the choice's log line
        assert "] CPU parallelism: REPLICAS, " in said.pop(0), proc.stderr
    assert said == [
        f"error: {net}:{line}: " + EMPTY_RECORDS[kind].format(tmp=tmp_path)], proc.stderr


LEAD_AFTER_MOVE = "issue 25: the fix is in netdef.py / schema.py / net.py, which the lead applies after the layout move"
INPUT_LAYER = "  - {name: data, type: Input, top: data, input: {shape: [[1, 3]]}}\n"
BAD_STRUCTURE = {  # the net file, the line the error must name, what it must say
    "name_is_a_mapping": ("name: {a: 1}\nlayers:\n" + INPUT_LAYER, 1, "key 'name': expected a string"),
    "layer_is_a_string": ("name: x\nlayers:\n" + INPUT_LAYER + "  - relu\n", 4, "layer #1 must be a mapping"),
    "layer_is_null": ("name: x\nlayers:\n" + INPUT_LAYER + "  -\n  - {name: r, type: ReLU, bottom: data, top: r}\n",
                      4, "layer #1 must be a mapping"),
    "nested_too_deeply": ("name: x\nlayers:\n" + INPUT_LAYER + "  - " + "[" * 5000 + "]" * 5000 + "\n", 4,
                          "nested too deeply"),
    "nested_too_deeply_in_a_layer": ("name: x\nlayers:\n" + INPUT_LAYER + "  - {name: r, type: ReLU, bottom: data, "
                                     "top: r}\n  - {name: s, type: ReLU, bottom: r, top: s, relu: "
                                     + "{a: " * 3000 + "1" + "}" * 3000 + "}\n", 5, "nested too deeply"),
}



@pytest.mark.parametrize("case", sorted(BAD_STRUCTURE))
def test_a_bad_net_structure_is_one_line_naming_its_line(tmp_path, case):
    text, line, message = BAD_STRUCTURE[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "layerforge", "check", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:{line}: ") and message in lines[0], proc.stderr


def _ip_net(tmp_path, layer_name):
    path = tmp_path / f"{layer_name}.yaml"
    path.write_text("name: n\nlayers:\n" + INPUT_LAYER.replace("[[1, 3]]", "[[2, 3], [2]]").replace("top: data",
                                                                                                   "top: [data, label]")
                    + f"  - {{name: {layer_name}, type: InnerProduct, bottom: data, top: ip, "
                      "inner_product: {num_output: 2}}\n"
                    + "  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")
    return path



@pytest.mark.parametrize("command", ["test", "train"])
@pytest.mark.parametrize("suffix", [".npz", ".caffemodel"])
def test_weights_that_match_no_layer_are_one_line(tmp_path, command, suffix):
    from layerforge.caffe.caffemodel import save_caffemodel

    other = Net(str(_ip_net(tmp_path, "fc")), phase="test")  # its only parameters belong to layer 'fc'
    weights = tmp_path / f"w{suffix}"
    other.save(str(weights)) if suffix == ".npz" else save_caffemodel(other, str(weights))
    net = _ip_net(tmp_path, "ip")
    (tmp_path / "solver.yaml").write_text(f"net: {net}\nbase_lr: 0.1\nmax_iter: 1\nsnapshot: 0\n")
    args = {"test": ["--model", str(net), "--iterations", "1"], "train": ["--solver", str(tmp_path / "solver.yaml")]}
    proc = subprocess.run([sys.executable, "-m", "layerforge", command, *args[command], "--weights", str(weights)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.strip().splitlines() if not line.startswith("I")]  # Caffe's log aside
    assert len(errors) == 1 and errors[0].startswith(f"error: {weights}: ") and "no layer" in errors[0], proc.stderr


# issue 50: deep nesting, HDF5 external links, and iteration counts that are not counts
SMALL_NET = ("name: small\nlayers:\n"
             "- {name: data, type: DummyData, top: [data, label], dummy_data: {shape: [[4, 3], [4]], "
             "data_filler: [{type: gaussian}, {type: constant}]}}\n"
             "- {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product: {num_output: 2, "
             "weight_filler: {type: xavier}}}\n"
             "- {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}\n")


def one_line(proc, starts):
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {starts}"), proc.stderr
    return errors[0]


def run_layerforge(*args, cwd=ROOT, env=None):
    env = dict(env or os.environ, PYTHONPATH=str(ROOT))  # this tree's layerforge from any working directory
    return subprocess.run([sys.executable, "-m", "layerforge", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=env)


@pytest.mark.parametrize("what", ["net", "solver"])
def test_a_prototxt_nested_500_deep_is_one_line(tmp_path, what):
    nested = "layer { " * 500 + "}" * 500
    if what == "net":
        path = tmp_path / "deep.prototxt"
        path.write_text(f"name: 'x'\n{nested}\n")
        proc = run_layerforge("check", path)
    else:
        path = tmp_path / "solver.prototxt"
        path.write_text(f"base_lr: 0.1\nmax_iter: 1\nnet_param {{\n  {nested}\n}}\n")
        proc = run_layerforge("train", "--solver", path)
    assert "messages nested more than 100 deep" in one_line(proc, f"{path}:{2 if what == 'net' else 4}: ")


def test_a_prototxt_nested_100_deep_is_read(tmp_path):
    from layerforge.caffe.prototxt import MAX_DEPTH, parse

    message = parse("a { " * MAX_DEPTH + "}" * MAX_DEPTH)
    for _ in range(MAX_DEPTH):
        message = message.entries[0].value
    assert message.entries == []


@pytest.fixture(scope="module")
def small_state(tmp_path_factory):
    """A solver (its file) and the solver state of its first iteration."""
    from layerforge.solvers import get_solver

    folder = tmp_path_factory.mktemp("state")
    (folder / "net.yaml").write_text(SMALL_NET)
    solver = folder / "solver.yaml"
    solver.write_text(f"net: {folder / 'net.yaml'}\nbase_lr: 0.1\nmax_iter: 2\nsnapshot: 1\ndisplay: 0\n"
                      f"snapshot_prefix: {folder / 'run'}\nrandom_seed: 1\n")
    get_solver(str(solver), max_iter=1).solve()
    return solver, dict(numpy.load(folder / "run_iter_1.solverstate.npz"))


DEEP_JSON = "[" * 100000 + "]" * 100000
BAD_STATES = {  # field -> value -> what the one line says
    "iter_negative": ("iter", numpy.array(-5), "field 'iter' is malformed (expected a whole number of iterations, "
                                               "got -5)"),
    "iter_fraction": ("iter", numpy.array(2.5), "field 'iter' is malformed (expected a whole number of iterations, "
                                                "got 2.5)"),
    "deep_data_state": ("data_state", numpy.array(DEEP_JSON), "field 'data_state' is malformed (nested too deeply"),
    "deep_rng": ("rng", numpy.array(DEEP_JSON), "field 'rng' is malformed (nested too deeply"),
    "deep_replicas": ("replicas", numpy.array(DEEP_JSON), "field 'replicas' is malformed (nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(BAD_STATES))
@pytest.mark.parametrize("cpu_parallel", ["THREADS", "REPLICAS"])
def test_a_bad_solver_state_is_one_line(tmp_path, small_state, case, cpu_parallel):
    solver, arrays = small_state
    field, value, message = BAD_STATES[case]
    state = tmp_path / "bad.solverstate.npz"
    arrays = dict(arrays, **{field: value})
    arrays["learned_net"] = numpy.array(str(solver.parent / "run_iter_1.npz"))
    numpy.savez(state, **arrays)
    proc = run_layerforge("train", "--solver", solver, "--snapshot", state, "--cpu-parallel", cpu_parallel,
                          cwd=tmp_path, env=two_cores())
    assert message in one_line(proc, f"{state}: "), proc.stderr


def test_a_negative_iteration_in_a_caffe_solver_state_is_one_line(tmp_path, small_state):
    from layerforge.caffe import solverstate
    from layerforge.solvers import get_solver

    solver, _ = small_state
    trained = get_solver(str(solver), snapshot_prefix=str(tmp_path / "c"), snapshot_format="BINARYPROTO")
    trained.iter = -5
    path = solverstate.snapshot(trained, str(tmp_path / "c_iter_-5"), "BINARYPROTO")
    from layerforge.errors import LayerforgeError

    with pytest.raises(LayerforgeError, match=r"'iter' is -5; a solver state counts the iterations done, from 0"):
        get_solver(str(solver)).restore(path)


def external_link(path, name, target):
    import h5py

    with h5py.File(path, "a") as f:
        f[name] = h5py.ExternalLink(str(target), "/elsewhere")


def test_an_hdf5_external_link_in_hdf5data_is_one_line(tmp_path):
    import h5py

    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        f["label"] = numpy.zeros(4)
    external_link(data, "data", tmp_path / "notes.txt")
    (tmp_path / "notes.txt").write_text("not HDF5\n")
    (tmp_path / "list.txt").write_text(f"{data}\n")
    net = tmp_path / "net.yaml"
    net.write_text("name: h\nlayers:\n- {name: data, type: HDF5Data, top: [data, label], "
                   f"hdf5_data: {{source: {tmp_path / 'list.txt'}, batch_size: 2}}}}\n")
    line = one_line(run_layerforge("check", net), f"{net}:3: layer 'data' (HDF5Data): ")
    assert line.endswith(f"{data}: '/data' is an external link to {tmp_path / 'notes.txt'}:/elsewhere; only data "
                         "stored in the file itself is read (copy it in, e.g. with h5py's Group.copy)"), line


@pytest.mark.parametrize("kind", ["weights", "state"])
def test_an_hdf5_external_link_in_a_snapshot_is_one_line(tmp_path, small_state, kind):
    import h5py

    from layerforge.solvers import get_solver

    solver, _ = small_state
    trained = get_solver(str(solver), max_iter=1, snapshot_prefix=str(tmp_path / "h"), snapshot_format="HDF5")
    trained.solve()
    weights, state = tmp_path / "h_iter_1.caffemodel.h5", tmp_path / "h_iter_1.solverstate.h5"
    if kind == "weights":
        with h5py.File(weights, "a") as f:
            del f["data/ip/0"]
        external_link(weights, "data/ip/0", tmp_path / "other.h5")
        proc, link = run_layerforge("train", "--solver", solver, "--weights", weights, cwd=tmp_path), "/data/ip/0"
        path = weights
    else:
        with h5py.File(state, "a") as f:
            del f["history/0"]
        external_link(state, "history/0", tmp_path / "other.h5")
        proc, link, path = run_layerforge("train", "--solver", solver, "--snapshot", state, cwd=tmp_path), \
            "/history/0", state
    line = one_line(proc, f"{path}: '{link}' is an external link to {tmp_path / 'other.h5'}:/elsewhere")
    assert "Iteration 0" not in proc.stderr, line


UNTRAINABLE = {  # issue 50: a net that trains nothing is refused by train, as a trainer should
    "no_layers": ("name: empty\nlayers: []\n", "net 'empty' has no layers in the TRAIN phase: there is nothing to train"),
    "no_loss": ("name: deploy\nlayers:\n" + INPUT
                + "- {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product: {num_output: 2}}\n",
                "net 'deploy' has no loss in the TRAIN phase (no layer with a loss_weight): training would change "
                "nothing"),
    "loss_only_in_test": ("name: t\nlayers:\n" + SMALL_NET.split("layers:\n")[1].replace(
        "top: loss}", "top: loss, include: {phase: TEST}}"), "net 't' has no loss in the TRAIN phase"),
}


@pytest.mark.parametrize("case", sorted(UNTRAINABLE))
def test_train_refuses_a_net_that_trains_nothing(tmp_path, case):
    text, message = UNTRAINABLE[case]
    net = tmp_path / "net.yaml"
    net.write_text(text)
    solver = tmp_path / "solver.yaml"
    solver.write_text(f"net: {net}\nbase_lr: 0.1\nmax_iter: 2\nsnapshot: 1\nsnapshot_prefix: {tmp_path / 's'}\n")
    line = one_line(run_layerforge("train", "--solver", solver, "--cpu-parallel", "THREADS"), f"{net}: ")
    assert message in line
    assert not list(tmp_path.glob("s_iter_*"))
    if case == "no_loss":  # time and test still take a deploy net
        assert run_layerforge("time", "--model", net, "--iterations", 1).returncode == 0
        from layerforge import Net

        Net(str(net), phase="test").save(str(tmp_path / "w.npz"))
        tested = run_layerforge("test", "--model", net, "--weights", tmp_path / "w.npz", "--iterations", 1)
        assert tested.returncode == 0, tested.stderr
    if case == "no_layers":  # time still takes it: it has no batch, so no training images/s
        timed = run_layerforge("time", "--model", net, "--iterations", 1)
        assert timed.returncode == 0 and "Traceback" not in timed.stderr, timed.stderr
