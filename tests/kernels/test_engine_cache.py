"""AUTO's convolution engine choices persist: in snapshots (a resumed run is bit-identical even where this
machine's timings would now pick other engines) and in the on-disk cache (a second start does no timing)."""
import json
import logging
import os
import subprocess
import sys

import numpy
import pytest

from layerforge import Net
from layerforge.kernels import autotune, engine_cache
from layerforge.solvers import get_solver

from ..solvers.test_snapshot import CONV_NET  # DummyData -> conv1 -> ReLU -> conv2 -> ip -> loss

CONVS = ("conv1", "conv2")


def prefer(monkeypatch, fast):
    """Make AUTO's timer report engine ``fast`` as the quicker one, whatever this machine measures."""
    record = autotune.AutoChoice.record
    monkeypatch.setattr(autotune.AutoChoice, "record",
                        lambda self, name, seconds: record(self, name, 1.0 if name == fast else 2.0))


def choices(net):
    return {name: net.layer_dict[name].engine_choice for name in CONVS}


def params(solver):
    return {name: [b.data.tobytes() for b in blobs] for name, blobs in solver.net.params.items()}


def use_cache(monkeypatch, path):
    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, str(path))


def test_resume_is_bit_identical_when_the_timings_now_pick_other_engines(tmp_path, monkeypatch):
    keys = dict(net_param=CONV_NET, base_lr=0.05, momentum=0.9, max_iter=12, snapshot=3, random_seed=5,
                display=0, snapshot_prefix=str(tmp_path / "a"))
    use_cache(monkeypatch, tmp_path / "cache_a")
    prefer(monkeypatch, "IMPLICIT")
    whole = get_solver(keys)
    whole.solve()
    assert set(choices(whole.net)["conv1"].values()) == {"IMPLICIT"}

    monkeypatch.undo()
    prefer(monkeypatch, "IM2COL")  # this "machine" now times IM2COL faster, and has no cache of the first run
    use_cache(monkeypatch, tmp_path / "cache_b")
    other = get_solver(dict(keys, snapshot_prefix=str(tmp_path / "o")))
    other.solve()
    assert set(choices(other.net)["conv1"].values()) == {"IM2COL"}
    assert params(other) != params(whole), "the engines round differently: the test could not tell them apart"

    use_cache(monkeypatch, tmp_path / "cache_c")
    resumed = get_solver(dict(keys, snapshot_prefix=str(tmp_path / "b")))
    resumed.solve(resume_file=str(tmp_path / "a_iter_6.solverstate.npz"))
    assert choices(resumed.net) == choices(whole.net)
    assert params(resumed) == params(whole)

    # the solver settles the choices before its first iteration: the snapshot of iteration 3 holds them (no
    # round-robin left to go on with), and a resumed run takes them over what this machine's cache says (IM2COL)
    from layerforge.npz import load_npz

    assert '"timing": {"' not in load_npz(tmp_path / "a_iter_3.solverstate.npz")["data_state"].item()
    monkeypatch.undo()
    prefer(monkeypatch, "IMPLICIT")
    use_cache(monkeypatch, tmp_path / "cache_b")
    early = get_solver(dict(keys, snapshot_prefix=str(tmp_path / "e")))
    early.solve(resume_file=str(tmp_path / "a_iter_3.solverstate.npz"))
    assert params(early) == params(whole)


def build_and_run(passes=3):
    net = Net(CONV_NET, phase="TRAIN")
    for _ in range(passes):  # AUTO settles after warmup + trials rounds over both engines
        net.forward()
        net.backward()
    return net


def test_second_start_takes_the_choices_from_the_cache_without_timing(monkeypatch, caplog):
    first = build_and_run(passes=6)
    settled = choices(first)
    assert all(None not in c.values() for c in settled.values())
    with open(engine_cache.cache_path()) as f:
        table = json.load(f)
    (machine, layers), = table.items()
    assert machine == engine_cache.machine_key(numpy) and len(layers) == 2

    calls = []
    monkeypatch.setattr(autotune.Stopwatch, "start", lambda self: calls.append(1))
    with caplog.at_level(logging.INFO, logger="layerforge"):
        second = build_and_run(passes=2)
    assert calls == []
    assert choices(second) == settled
    cached = [r.getMessage() for r in caplog.records if "from the engine cache" in r.getMessage()]
    assert len(cached) == 2 and engine_cache.cache_path() in cached[0]


def test_a_new_shape_misses_the_cache_and_is_timed(monkeypatch):
    build_and_run(passes=6)
    calls = []
    monkeypatch.setattr(autotune.Stopwatch, "start", lambda self: calls.append(1))
    net = Net(CONV_NET, phase="TRAIN")
    net.blobs["data"].reshape(4, 3, 12, 12)
    net.blobs["label"].reshape(4)
    net.reshape()
    assert None in net.layer_dict["conv1"].engine_choice.values()
    net.forward()
    assert calls


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"m": 3}', b"\xff\xfe\x00"])
def test_a_corrupt_cache_is_one_warning_naming_it_and_is_replaced(content, caplog):
    path = engine_cache.cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(content)
    with caplog.at_level(logging.INFO, logger="layerforge"):
        net = build_and_run(passes=6)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(path) and "engine cache ignored" in warnings[0]
    assert all(None not in c.values() for c in choices(net).values())
    with open(path) as f:
        assert len(json.load(f)[engine_cache.machine_key(numpy)]) == 2  # the next store wrote a good file


def test_an_unwritable_cache_dir_costs_only_a_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    use_cache(monkeypatch, blocker / "sub")
    with caplog.at_level(logging.INFO, logger="layerforge"):
        net = build_and_run(passes=6)
    assert all(None not in c.values() for c in choices(net).values())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(engine_cache.cache_path())


def test_a_lock_held_by_a_stopped_process_costs_the_choice_not_the_run(monkeypatch, caplog):
    # a process stopped while it holds the cache's lock (SIGSTOP: issue 50's stalled rank) must not stop another
    # that stores a choice: it waits LOCK_WAIT seconds, warns once naming the file, and goes on without storing
    import fcntl
    import time

    monkeypatch.setattr(engine_cache, "LOCK_WAIT", 0.3)
    path = engine_cache.cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               path + ".lock"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with caplog.at_level(logging.INFO, logger="layerforge"):
            engine_cache.ENGINES.store("machine", "key", {"forward": "IM2COL"})
        assert time.monotonic() - t0 < 5
    finally:
        holder.kill()
        holder.wait()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(path) and "locked by another process" in warnings[0]
    assert not os.path.exists(path)
    with open(path + ".lock") as f:  # the lock is free again: the next store keeps its choice
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    engine_cache.ENGINES.store("machine", "key", {"forward": "IM2COL"})
    assert engine_cache.ENGINES.lookup("machine", "key") == {"forward": "IM2COL"}


def test_off_writes_nothing_and_the_default_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, "off")
    monkeypatch.chdir(tmp_path)
    build_and_run(passes=6)
    assert engine_cache.cache_path() is None and list(tmp_path.iterdir()) == []
    monkeypatch.delenv(engine_cache.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert engine_cache.cache_path() == str(tmp_path / "xdg" / "layerforge" / "conv_engines.json")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert engine_cache.cache_dir() == str(tmp_path / "home" / ".cache" / "layerforge")


BASE = dict(layer_type="Convolution", x_shape=(8, 3, 12, 12), y_shape=(8, 6, 12, 12), w_shape=(6, 3, 3, 3),
            geometry=(3, 3, 1, 1, 1, 1, 1, 1), group=1, dtype=numpy.dtype("float32"), engines=("IM2COL", "IMPLICIT"))


@pytest.mark.parametrize("change", [
    dict(layer_type="Deconvolution"), dict(x_shape=(4, 3, 12, 12)), dict(y_shape=(8, 6, 6, 6)),
    dict(w_shape=(6, 1, 3, 3)), dict(geometry=(3, 3, 2, 2, 1, 1, 1, 1)), dict(geometry=(3, 3, 1, 1, 0, 0, 1, 1)),
    dict(geometry=(3, 3, 1, 1, 1, 1, 2, 2)), dict(group=3), dict(dtype=numpy.dtype("float64")),
    dict(engines=("IM2COL", "IMPLICIT", "WINOGRAD"))])
def test_the_layer_key_tells_apart_everything_that_affects_the_choice(change):
    assert engine_cache.layer_key(**dict(BASE, **change)) != engine_cache.layer_key(**BASE)


def test_the_layer_key_names_the_rule_of_choice(monkeypatch):
    """Choices an earlier rule of AUTO made (each direction its fastest alone) are timed again, not read."""
    now = engine_cache.layer_key(**BASE)
    assert now.endswith(f"|rule={engine_cache.CHOICE_RULE}") and engine_cache.CHOICE_RULE >= 2
    monkeypatch.setattr(engine_cache, "CHOICE_RULE", engine_cache.CHOICE_RULE + 1)
    assert engine_cache.layer_key(**BASE) != now


def test_the_machine_key_follows_the_thread_setting(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one = engine_cache.machine_key(numpy)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert engine_cache.machine_key(numpy) != one and one.startswith("cpu|")


def test_the_machine_key_follows_a_pinned_blas_kernel(monkeypatch):
    """Choices timed with OpenBLAS's kernels pinned (OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU: half the SGEMM
    rate) are not taken for a run without the pin, nor the other way round."""
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.delenv("OPENBLAS_L2_SIZE", raising=False)
    free = engine_cache.machine_key(numpy)
    assert "OPENBLAS_CORETYPE" not in free
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    pinned = engine_cache.machine_key(numpy)
    assert pinned != free and "OPENBLAS_CORETYPE=Haswell" in pinned
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    assert engine_cache.machine_key(numpy) not in (free, pinned)


def _store_many(path, worker, count):
    os.environ[engine_cache.CACHE_DIR_ENV] = path
    for k in range(count):
        engine_cache.ENGINES.store("machine", f"layer {worker}.{k}", {"forward": "IM2COL"})


def test_processes_storing_at_once_lose_none_of_each_other_s_choices(tmp_path, monkeypatch):
    """The replicas of a split batch time the same layers and store at the same moments: each store reads, merges
    and renames under a lock, so none overwrites another's entry with a table read before it."""
    import multiprocessing

    use_cache(monkeypatch, tmp_path)
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_store_many, args=(str(tmp_path), w, 40)) for w in range(3)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
    assert [p.exitcode for p in workers] == [0, 0, 0]
    with open(engine_cache.cache_path()) as f:
        assert len(json.load(f)["machine"]) == 120
