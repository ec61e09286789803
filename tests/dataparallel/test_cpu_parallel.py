"""cpu_parallel: the choice between one process on every core and one replica per core (a rigged timer), and
replicas of one batch training exactly as one process with the whole batch does."""
import json

import numpy
import pytest

from layerforge.dataparallel import cpu_parallel
from layerforge.dataparallel.cgdp import train_parallel
from layerforge.dataparallel.cgdp.chunks import WHOLE
from layerforge.errors import ConfigError, LayerforgeError
from layerforge.kernels import engine_cache
from layerforge.solvers import get_solver
from layerforge.solvers.param import load_solver_param
from layerforge.solvers.solver import SOLVER_REGISTRY

from .cgdp import helpers
from .cgdp.helpers import flat_params, write_lmdb


def net(source, batch, extra=()):
    """helpers.net (Data without shuffling -> conv -> ReLU -> max pool -> ip1..ip5 -> softmax loss) with LRN after
    the ReLU, Dropout after ip1, and ``extra`` layers (each reading and writing ``pool``) after the pooling."""
    layers = helpers.net(source, batch)["layers"]
    index = {layer["name"]: k for k, layer in enumerate(layers)}
    layers[index["pool"]]["bottom"] = "norm"
    layers.insert(index["pool"], {"name": "norm", "type": "LRN", "bottom": "conv", "top": "norm",
                                  "lrn": {"local_size": 3}})
    layers.insert(index["relu1"] + 2, {"name": "drop", "type": "Dropout", "bottom": "ip1", "top": "ip1"})
    layers[index["pool"] + 2:index["pool"] + 2] = list(extra)
    return {"name": "replicas", "layers": layers}


def solver(source, batch, max_iter=6, extra=(), **keys):
    return dict({"net_param": net(source, batch, extra), "type": "SGD", "base_lr": 0.1, "momentum": 0.9,
                 "weight_decay": 0.01, "max_iter": max_iter, "dtype": "float64", "random_seed": 3,
                 "snapshot_after_train": False}, **keys)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_lmdb(tmp_path_factory.mktemp("replicas") / "db", n=48)  # divisible by 2 and 3


# --------------------------------------------------------------------------------------------------
# replicas of one batch == one process with the whole batch


BN_CHAIN = ({"name": "bn", "type": "BatchNorm", "bottom": "pool", "top": "pool"},
            {"name": "bn_scale", "type": "Scale", "bottom": "pool", "top": "pool", "scale": {"bias_term": True}},
            {"name": "bn_relu", "type": "ReLU", "bottom": "pool", "top": "pool"})


@pytest.mark.parametrize("replicas,iter_size,rule,extra,fuse,clip", [
    (2, 1, "SGD", (), True, -1),
    (3, 2, "Adam", (), True, -1),  # iter_size 2: the host makes the mean
    (2, 1, "SGD", BN_CHAIN, True, -1),  # BatchNorm + Scale + ReLU fused: the whole batch's statistics
    (3, 1, "SGD", BN_CHAIN, False, -1),  # one by one
    (2, 1, "SGD", (), True, 0.05),  # clipping takes the mean's global norm: the host makes the mean
])
def test_replicas_train_as_one_process_with_the_whole_batch(source, replicas, iter_size, rule, extra, fuse, clip):
    d = solver(source, 12, iter_size=iter_size, type=rule, extra=extra, clip_gradients=clip)
    d["net_param"]["fuse_batch_norm"] = fuse
    one = get_solver(d)
    one.solve()
    result = train_parallel(d, workers=replicas, sync="host", split=True, log=False)
    assert result.iter == 6
    # the replicas make the mean of their shares in their update, unless the update needs all of it
    host_mean = any(name.startswith("accumulate:") for name in result.stats["chunks_ms"])
    assert host_mean == (iter_size > 1 or clip > 0)
    # and then post their gradients as one chunk when backward ends: the host has nothing to overlap with it
    assert (result.stats["chunk_size"] == WHOLE) == (not host_mean), result.stats["chunk_size"]
    expected = flat_params(one)
    assert not numpy.allclose(expected, flat_params(get_solver(d)))  # training moved the weights
    for row in result.params:  # one shared copy of the parameters: every replica ends with it
        numpy.testing.assert_allclose(row, expected, rtol=1e-10, atol=1e-12)


def test_snapshot_of_replicas_resumes_in_one_process(source, tmp_path):
    """The replicas' snapshot holds the one process's read positions: a run of either kind resumes it."""
    d = solver(source, 12, snapshot=3, snapshot_prefix=str(tmp_path / "r"))
    result = train_parallel(d, workers=2, sync="host", split=True, log=False)
    state = numpy.load(tmp_path / "r_iter_3.solverstate.npz")
    positions = json.loads(state["data_state"].item())["train"]["data"]["position"]
    assert positions == 3 * 12
    resumed = get_solver(dict(d, snapshot=0))
    resumed.solve(resume_file=str(tmp_path / "r_iter_3.solverstate.npz"))
    numpy.testing.assert_allclose(flat_params(resumed), result.params[0], rtol=1e-10, atol=1e-12)
    again = train_parallel(dict(d, snapshot=0), workers=2, sync="host", split=True, log=False,
                           resume=str(tmp_path / "r_iter_3.solverstate.npz"))
    numpy.testing.assert_allclose(again.params[0], result.params[0], rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# what a net needs for replicas to be exact


def layers_of(d):
    return cpu_parallel.train_layers(load_solver_param(d, SOLVER_REGISTRY))


BN = {"name": "bn", "type": "BatchNorm", "bottom": "pool", "top": "pool"}
SUM = {"name": "sum", "type": "Reduction", "bottom": "pool", "top": "pool_sum"}


@pytest.mark.parametrize("extra,batch,loss,reason", [
    ((), 12, {}, None),
    ((dict(BN, batch_norm={"use_global_stats": True}),), 12, {}, None),
    ((BN,), 12, {}, None),  # with the whole batch's statistics, exchanged
    ((), 10, {}, "batch 10 (layer 'data') does not split into 3 equal replica batches"),
    ((), 12, {"normalization": "NONE"}, "layer 'loss' (SoftmaxWithLoss) sums the loss"),
    ((), 12, {"ignore_label": 1}, "layer 'loss' (SoftmaxWithLoss) divides by the count of labels not ignored"),
    ((), 12, {"ignore_label": 1, "normalization": "BATCH_SIZE"}, None),
    ((SUM,), 12, {},
     "layer 'sum' (Reduction) is not known to treat the samples of a batch independently"),
    (({"name": "cat", "type": "Concat", "bottom": ["pool", "pool"], "top": "pool2", "concat": {"axis": 0}},), 12, {},
     "layer 'cat' (Concat) works along axis 0"),
    (({"name": "sp", "type": "Pooling", "bottom": "pool", "top": "pool", "pooling": {"pool": "STOCHASTIC",
                                                                                      "kernel_size": 1}},), 12, {},
     "layer 'sp' (Pooling) draws its stochastic pooling per replica"),
])
def test_replica_refusals_name_the_layer(source, extra, batch, loss, reason):
    d = solver(source, batch, extra=extra)
    if loss:
        d["net_param"]["layers"][-1]["loss"] = loss
    refusal = cpu_parallel.replica_refusal(layers_of(d), 3)
    if reason is None:
        assert refusal is None
    else:
        assert refusal.startswith(reason), refusal


def assert_three_replicas_train_as_one_process(d):
    """Solver dict ``d`` trained by 3 replicas of a split batch ends at one process's parameters, which moved."""
    assert cpu_parallel.replica_refusal(layers_of(d), 3) is None
    one = get_solver(d)
    one.solve()
    result = train_parallel(d, workers=3, sync="host", split=True, log=False)
    numpy.testing.assert_allclose(result.params[0], flat_params(one), rtol=1e-10, atol=1e-12)
    assert not numpy.allclose(result.params[0], flat_params(get_solver(d)))  # it trained


def test_random_dummy_data_trains_as_one_process(tmp_path):
    """DummyData refilled from the random stream (the zoo's synthetic data) draws the whole batch in each replica."""
    d = {"net_param": {"name": "dummy", "layers": [
        {"name": "data", "type": "DummyData", "top": ["x", "label"],
         "dummy_data": {"shape": [[6, 3], [6]], "integer": [False, True],
                        "data_filler": [{"type": "gaussian"}, {"type": "uniform", "min": 0, "max": 2}]}},
        {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "ip",
         "inner_product": {"num_output": 2, "weight_filler": {"type": "xavier"}}},
        {"name": "drop", "type": "Dropout", "bottom": "ip", "top": "ip"},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]},
        "base_lr": 0.1, "momentum": 0.9, "max_iter": 5, "dtype": "float64", "random_seed": 7,
        "snapshot_after_train": False}
    assert_three_replicas_train_as_one_process(d)


def test_synthetic_data_trains_as_one_process():
    """SyntheticData (the zoo's default input) draws the whole batch's labels and noise in each replica."""
    d = {"net_param": {"name": "synthetic", "layers": [
        {"name": "data", "type": "SyntheticData", "top": ["x", "label"],
         "synthetic_data": {"batch_size": 6, "shape": [2, 4, 4], "classes": 4, "grid": 2}},
        {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "ip",
         "inner_product": {"num_output": 4, "weight_filler": {"type": "xavier"}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]},
        "base_lr": 0.1, "momentum": 0.9, "max_iter": 5, "dtype": "float64", "random_seed": 7,
        "snapshot_after_train": False}
    assert_three_replicas_train_as_one_process(d)


# --------------------------------------------------------------------------------------------------
# the choice: a rigged timer, the cache, the overrides


class Timer:
    """Stands in for the trial: images per second and peak memory (bytes, 0: unknown) by mode, and a record of what
    was measured."""

    def __init__(self, threads, replicas, peaks=(0, 0)):
        self.rates, self.calls = {"THREADS": threads, "REPLICAS": replicas}, []
        self.peaks = dict(zip(("THREADS", "REPLICAS"), peaks))

    def __call__(self, mode, replicas):
        self.calls.append((mode, replicas))
        return self.rates[mode], self.peaks[mode]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "cpu_parallel.json"


def choose(d, requested="AUTO", timer=None, run=None, resume=None):
    sp = load_solver_param(d, SOLVER_REGISTRY)
    return cpu_parallel.choose(sp, cpu_parallel.train_layers(sp), requested, timer, replicas=2, run=run,
                               resume=resume)


def test_auto_times_both_once_and_remembers_the_faster(source, cache):
    d = solver(source, 12)
    timer = Timer(threads=10.0, replicas=14.0)
    choice = choose(d, timer=timer)
    assert (choice.mode, choice.replicas) == ("REPLICAS", 2)
    assert timer.calls == [("THREADS", 1), ("REPLICAS", 2)]
    assert choice.why == "trial: 14.00 img/s with 2 replicas, 10.00 img/s with threads"
    assert "REPLICAS, 2 single-threaded replicas" in choice.describe()
    stored = json.loads(cache.read_text())
    assert list(stored) == [engine_cache.machine_key(numpy)]
    (key, entry), = stored[engine_cache.machine_key(numpy)].items()
    assert "batch=12" in key and "replicas=2" in key and entry["mode"] == "REPLICAS"

    again = Timer(threads=99.0, replicas=1.0)  # this "machine" would now choose otherwise: the cache decides
    choice = choose(d, timer=again)
    assert choice.mode == "REPLICAS" and again.calls == []
    assert choice.why.startswith("remembered from a trial: 14.00 img/s")

    other = Timer(threads=99.0, replicas=1.0)  # another batch is another key: timed again
    assert choose(solver(source, 8), timer=other).mode == "THREADS" and len(other.calls) == 2
    bf16 = Timer(threads=99.0, replicas=1.0)  # so is another GEMM precision
    assert choose(dict(d, gemm_precision="BF16"), timer=bf16).mode == "THREADS" and len(bf16.calls) == 2


def test_a_choice_timed_against_earlier_replicas_is_timed_again(source, cache):
    """A choice stored before the replicas' revision (cpu_parallel.REPLICAS_REVISION; 2: one chunk, 3: the trial's
    nets share their activations' storage) is not used."""
    d = solver(source, 12)
    choose(d, timer=Timer(threads=10.0, replicas=14.0))
    stored = json.loads(cache.read_text())
    machine = engine_cache.machine_key(numpy)
    (key, entry), = stored[machine].items()
    assert key.endswith(f"|revision={cpu_parallel.REPLICAS_REVISION}") and cpu_parallel.REPLICAS_REVISION == 3
    # as a revision before wrote it (2; none before that), with another mode
    for earlier in ("|revision=2", ""):
        stored[machine] = {key.replace("|revision=3", earlier): dict(entry, mode="THREADS")}
        cache.write_text(json.dumps(stored))
        timer = Timer(threads=10.0, replicas=14.0)
        choice = choose(d, timer=timer)
        assert choice.mode == "REPLICAS" and timer.calls == [("THREADS", 1), ("REPLICAS", 2)]
        assert choice.why.startswith("trial: 14.00 img/s")


@pytest.mark.parametrize("peaks,mode", [((1000, 1600), "REPLICAS"), ((1000, 1601), "THREADS"), ((1000, 1700), "THREADS"),
                                        ((1600, 2400), "REPLICAS"), ((0, 1900), "REPLICAS")])  # 0: not measured
def test_replicas_that_hold_more_than_the_memory_limit_are_not_chosen(source, cache, peaks, mode):
    """Faster replicas are chosen only within REPLICA_MEMORY_LIMIT (1.6) times one process's peak memory: not
    AlexNet's (1.9x) nor VGG-16's (1.7x), ResNet-50's (1.3-1.5x) yes."""
    assert cpu_parallel.REPLICA_MEMORY_LIMIT == 1.6
    choice = choose(solver(source, 12), timer=Timer(threads=10.0, replicas=14.0, peaks=[p << 20 for p in peaks]))
    assert choice.mode == mode
    if peaks[0]:
        assert choice.why.endswith(f"; the replicas' peak memory {peaks[1] / peaks[0]:.2f}x one process's "
                                   f"({peaks[1]} MiB)")
    assert json.loads(cache.read_text())[engine_cache.machine_key(numpy)].popitem()[1]["mode"] == mode


def test_the_trial_measures_each_configurations_peak_memory(source, cache):
    """timed_trial's measure: images per second and the peak resident memory of this process (THREADS) or of it and
    its replicas (REPLICAS), counted from what the process held before the trials (not what the THREADS trial left)."""
    import os
    from layerforge.dataparallel.peak_memory import process_tree, resident
    sp = load_solver_param(solver(source, 12), SOLVER_REGISTRY)
    before = sum(resident(os.getpid()))
    assert process_tree(os.getpid())[0] == os.getpid() and before > 0
    measure = cpu_parallel.timed_trial(sp)
    rate, peak = measure("THREADS", 1)
    assert rate > 0 and peak >= before
    rate, peak = measure("REPLICAS", 2)
    assert rate > 0 and peak - before > 100 << 20  # two more processes, each with numpy and the net


def test_the_peak_memory_sees_a_child_that_lives_half_a_second():
    """The tree of processes is looked at every sample: looked at once a second, a replica that lived between two
    looks went unseen (a REPLICAS trial's peak 13 MB over its process's)."""
    import os
    import subprocess
    import sys
    import time
    from layerforge.dataparallel.peak_memory import PeakMemory, resident
    before = sum(resident(os.getpid()))
    memory = PeakMemory(os.getpid())
    time.sleep(0.3)  # the sampler has looked at the tree before the child starts
    subprocess.run([sys.executable, "-c", "import time; a = bytearray(300 << 20); time.sleep(0.5)"], check=True)
    peak = memory.stop()
    assert peak - before > 250 << 20, (peak - before) >> 20


def test_a_failing_replicas_trial_leaves_one_process_and_no_choice(source, cache, caplog):
    def measure(mode, replicas):
        if mode == "REPLICAS":
            raise LayerforgeError("worker 1 (pid 42) was killed by signal SIGKILL; the job was stopped")
        return 1.0, 0

    choice = choose(solver(source, 12), timer=measure)
    assert (choice.mode, choice.why) == ("THREADS", "the replicas' trial failed")
    assert "the replicas' trial failed (worker 1 (pid 42) was killed" in caplog.text
    assert not cache.exists()


def test_a_failing_trial_leaves_one_process_to_say_the_error(source, cache):
    def measure(mode, replicas):
        raise LayerforgeError("db: key '00000003': corrupted record")

    choice = choose(solver(source, 12), timer=measure)
    assert (choice.mode, choice.why, choice.quiet) == ("THREADS", "the trial failed", False)
    assert not cache.exists()


def test_a_short_run_is_not_timed_unless_a_choice_is_remembered(source, cache):
    d = solver(source, 12)
    untimed = Timer(threads=1.0, replicas=2.0)
    choice = choose(d, timer=untimed, run=cpu_parallel.SHORT_RUN - 1)
    assert (choice.mode, choice.quiet) == ("THREADS", True) and untimed.calls == [] and not cache.exists()
    assert choose(d, timer=untimed, run=cpu_parallel.SHORT_RUN).mode == "REPLICAS" and len(untimed.calls) == 2
    remembered = choose(d, timer=untimed, run=1)
    assert (remembered.mode, remembered.quiet) == ("REPLICAS", False) and len(untimed.calls) == 2
    assert choose(d, "REPLICAS", untimed, run=1).mode == "REPLICAS"


def test_a_snapshot_the_replicas_cannot_resume_keeps_one_process(source, cache, tmp_path):
    def state(position):
        path = tmp_path / f"s{position}.solverstate.npz"
        numpy.savez(path, data_state=numpy.array(json.dumps({"train": {"data": {"seed": 1, "position": position}}})))
        return str(path)

    d, untimed = solver(source, 12), Timer(threads=1.0, replicas=2.0)
    choice = choose(d, timer=untimed, resume=state(37))
    assert choice.mode == "THREADS" and untimed.calls == []
    assert choice.why == (f"replicas would not be one process: layer 'data' of {state(37)} read 37 records, which "
                          "do not split into 2 equal replica shares")
    with pytest.raises(ConfigError, match="REPLICAS would not train as one process does: layer 'data' of "):
        choose(d, "REPLICAS", untimed, resume=state(37))
    assert choose(d, timer=untimed, resume=state(36)).mode == "REPLICAS"
    (tmp_path / "bad.solverstate.npz").write_text("not a zip")  # the run itself says what is wrong with it
    assert cpu_parallel.resume_refusal(str(tmp_path / "bad.solverstate.npz"), 2) is None


def test_replicas_must_win_by_the_margin(source, cache):
    timer = Timer(threads=10.0, replicas=10.0 * cpu_parallel.MARGIN * 0.99)
    assert choose(solver(source, 12), timer=timer).mode == "THREADS"


def test_forced_modes_and_refused_nets_are_not_timed(source, cache):
    d = solver(source, 12)
    untimed = Timer(threads=1.0, replicas=2.0)
    assert choose(d, "THREADS", untimed).mode == "THREADS"
    assert choose(d, "REPLICAS", untimed).mode == "REPLICAS"
    refused = solver(source, 12, extra=(SUM,))
    choice = choose(refused, "AUTO", untimed)
    assert choice.mode == "THREADS" and choice.why.startswith("replicas would not be one process: layer 'sum'")
    assert untimed.calls == [] and not cache.exists()
    with pytest.raises(ConfigError) as e:
        choose(refused, "REPLICAS", untimed)
    assert "cpu_parallel REPLICAS would not train as one process does: layer 'sum' (Reduction)" in str(e.value)
    assert "\n" not in str(e.value)


def test_solver_key_and_override_reach_the_choice(source, cache, tmp_path):
    path = tmp_path / "solver.yaml"
    d = solver(source, 12, cpu_parallel="THREADS")
    import yaml

    path.write_text(yaml.safe_dump(d))
    untimed = Timer(threads=1.0, replicas=2.0)
    assert cpu_parallel.resolve(str(path), measure=untimed).mode == "THREADS"
    expected = "REPLICAS" if cpu_parallel.cores() > 1 else "THREADS"  # the timer rates replicas 2x
    assert cpu_parallel.resolve(str(path), requested="AUTO", measure=untimed).mode == expected
    bad = solver(source, 12, extra=(SUM,), cpu_parallel="REPLICAS")
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError) as e:
        cpu_parallel.resolve(str(path), measure=untimed)
    assert str(e.value).startswith(f"{path}:") and "cpu_parallel" in str(e.value)
    assert cpu_parallel.resolve(dict(d, solver_mode="GPU"), measure=untimed) is None
