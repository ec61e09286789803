"""G workers x batch b == one worker x batch G*b, in host and tree modes; failures end the job cleanly."""
import errno
import functools
import multiprocessing.util
import os
import signal
import threading
import time

import numpy
import pytest

from layerforge.errors import Interrupted, LayerforgeError, interrupting
from layerforge.dataparallel.cgdp import WorkerOptions, WorkerPool, shm, train_parallel
from layerforge.dataparallel.cgdp.host import HostAccumulator
from layerforge.solvers import get_solver
from tests.conftest import EMULATED_GPU
from tests.devices import two_devices

from .helpers import (bad_record_on_worker_1, bug_on_worker_1, die_on_worker_1, flat_params, report_threads, solver,
                      write_lmdb)

ITERS = 6
AUTO = {"chunk_search_interval": 2, "chunk_search_step": 2, "chunk_search_range": 1}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_lmdb(tmp_path_factory.mktemp("cgdp") / "db")


@functools.lru_cache(maxsize=None)  # the same one-worker run for the tests that compare with it
def reference(source, batch, frozen=False):
    s = get_solver(solver(source, batch, ITERS, frozen))
    s.solve()
    params = flat_params(s)
    params.flags.writeable = False  # shared between tests: none may change it
    return params


@pytest.mark.parametrize("sync,chunk_size", [("host", 1), ("host", 3), ("host", "auto"), ("tree", 1)])
def test_two_workers_match_one_worker_with_the_whole_batch(source, sync, chunk_size):
    expected = reference(source, 8)
    result = train_parallel(solver(source, 4, ITERS, **AUTO), workers=2, sync=sync, chunk_size=chunk_size, log=False)
    assert result.iter == ITERS
    numpy.testing.assert_allclose(result.params[0], expected, rtol=1e-10, atol=1e-12)
    numpy.testing.assert_array_equal(result.params[1], result.params[0])  # replicas stay identical
    if chunk_size == "auto":  # interval 2, step 2: sizes 1, 3, 5 are tried while they keep improving
        assert result.chunk_size in (1, 3, 5)
        assert len(result.iteration_times) == ITERS - 1


def test_three_workers_host_chunks_of_three(source):
    expected = reference(source, 6)
    result = train_parallel(solver(source, 2, ITERS), workers=3, sync="host", chunk_size=3, log=False)
    numpy.testing.assert_allclose(result.params[2], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("sync", ["host", "tree"])
def test_frozen_layer_and_parameter_free_layers(source, sync):
    expected = reference(source, 8, frozen=True)
    result = train_parallel(solver(source, 4, ITERS, frozen=True), workers=2, sync=sync, chunk_size=1, log=False)
    numpy.testing.assert_allclose(result.params[0], expected, rtol=1e-10, atol=1e-12)


def test_net_without_parameters_has_no_chunks_and_no_deadlock():
    net = {"name": "empty", "layers": [
        {"name": "data", "type": "DummyData", "top": ["x", "label"],
         "dummy_data": {"shape": [[2, 3], [2]], "data_filler": [{"type": "gaussian"}, {"type": "constant"}]}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["x", "label"], "top": "loss"}]}
    d = {"net_param": net, "max_iter": 3, "base_lr": 0.1, "snapshot_after_train": False}
    result = train_parallel(d, workers=2, sync="host", chunk_size=2, log=False)
    assert result.iter == 3 and result.params.shape == (2, 0)


def test_worker_that_exits_ends_the_job_with_one_line(source):
    options = WorkerOptions(solver(source, 4, 1000), sync="HOST", log=False, setup=die_on_worker_1)
    t0 = time.perf_counter()
    with pytest.raises(LayerforgeError) as e:
        WorkerPool(2, options).run()
    assert time.perf_counter() - t0 < 30
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("worker 1 (pid ") and "exited with code 7" in message


def test_a_workers_error_is_the_users_line_and_a_crash_names_the_worker(source):
    """A LayerforgeError in a worker reaches the user as one process says it; any other exception names the worker."""
    for setup, expected in [(bad_record_on_worker_1, "db: key '00000042': corrupted record"),
                            (bug_on_worker_1, None)]:
        with pytest.raises(LayerforgeError) as e:
            WorkerPool(2, WorkerOptions(solver(source, 4, 1000), sync="HOST", log=False, setup=setup)).run()
        message = str(e.value)
        if expected is not None:
            assert message == expected
        else:
            assert message.startswith("worker 1 (pid ") and "failed: RuntimeError: a bug over two lines (helpers.py:" \
                in message
            assert "\n" not in message


@pytest.mark.parametrize("sync", ["HOST", "TREE"])
def test_killed_worker_ends_the_job(source, sync):
    pool = WorkerPool(2, WorkerOptions(solver(source, 4, 10 ** 6), sync=sync, log=False))
    outcome = {}

    def run():
        try:
            pool.run()
        except LayerforgeError as err:
            outcome["error"] = str(err)

    thread = threading.Thread(target=run)
    thread.start()
    assert pool.started.wait(30)
    time.sleep(0.3)  # let it train a few iterations
    os.kill(pool.procs[0].pid, 9)
    thread.join(30)
    assert not thread.is_alive()
    assert "worker 0 (pid " in outcome["error"] and "killed by signal SIGKILL" in outcome["error"]


def _sigterm():
    os.kill(os.getpid(), signal.SIGTERM)  # handled before os.kill returns (main thread): Interrupted, right here


@pytest.mark.parametrize("where", ["made", "returned", "closing", "full"])
def test_an_interrupt_or_error_anywhere_leaves_no_shared_memory_behind(source, monkeypatch, where):
    """SIGTERM within errors.interrupting (AUTO's trial of REPLICAS) raises at any bytecode: just after the second
    of the host buffers' segments is made, as shm.create returns them, or as the pool closes at the end of a run;
    or /dev/shm is full at the third. The job ends with that, and every segment made is unlinked (the resource
    tracker said "leaked shared_memory objects" at the exit, once per segment left)."""
    made, real_create, real_close = [], shm.create, HostAccumulator.close

    def segment(*args, **kwargs):
        if where == "full" and len(made) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        made.append(real_segment(*args, **kwargs))
        if where == "made" and len(made) == 2:
            _sigterm()
        return made[-1]

    def create(*args):
        buffers = real_create(*args)
        if where == "returned":
            _sigterm()
        return buffers

    def close(accumulator):
        real_close(accumulator)
        if where == "closing":
            _sigterm()

    real_segment = shm.shared_memory.SharedMemory
    monkeypatch.setattr(shm.shared_memory, "SharedMemory", segment)
    monkeypatch.setattr(shm, "create", create)
    monkeypatch.setattr(HostAccumulator, "close", close)
    pool = WorkerPool(2, WorkerOptions(solver(source, 4, 2), sync="HOST", log=False))
    try:
        with pytest.raises(OSError if where == "full" else Interrupted):
            with interrupting():
                pool.run()
        left = [s.name for s in made if os.path.exists("/dev/shm/" + s.name.lstrip("/"))]
        assert len(made) >= 2 and left == []
    finally:
        for s in made:  # what the code before the fix left: this run must not leak it too
            try:
                s.unlink()
            except FileNotFoundError:
                pass


def test_a_signal_as_a_worker_is_spawned_leaves_no_worker_unrecorded(source, monkeypatch, capfd):
    """SIGTERM within errors.interrupting just as a worker's process is spawned, before the pool writes it what to
    run: the job ends with Interrupted, the worker was recorded and stopped, and none printed a traceback (it read an
    empty pipe: "EOFError: Ran out of input" after train's "interrupted by SIGTERM")."""
    spawned, real_spawn = [], multiprocessing.util.spawnv_passfds

    def spawn(path, args, passfds):
        pid = real_spawn(path, args, passfds)
        if "spawn_main" in str(args):  # a worker, not the resource tracker
            spawned.append(pid)
            if len(spawned) == 1:
                _sigterm()
        return pid

    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", spawn)
    pool = WorkerPool(2, WorkerOptions(solver(source, 4, 2), sync="HOST", log=False))
    try:
        with pytest.raises(Interrupted):
            with interrupting():
                pool.run()
        assert spawned and spawned == [p.pid for p in pool.procs] and not any(p.is_alive() for p in pool.procs)
        assert "Traceback" not in capfd.readouterr().err
    finally:
        for pid in spawned:  # what the code before the fix left running: this run must not leave it
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


NODE_SCRIPT = """
import sys
import numpy
from layerforge.comm import Communicator, launch_guard
from layerforge.dataparallel.cgdp import train_parallel
from tests.dataparallel.cgdp.helpers import solver

source, out = sys.argv[1], sys.argv[2]
with launch_guard() as mpi_comm:
    comm = Communicator(mpi_comm)
    result = train_parallel(solver(source, 2, {iters}), workers=2, sync="host", chunk_size={chunk}, comm=comm,
                            log=False)
    numpy.save(f"{{out}}.{{comm.rank}}.npy", result.params)
"""


@pytest.mark.parametrize("chunk_size", [1, 3])
def test_two_nodes_of_two_workers_match_one_worker_with_the_whole_batch(source, tmp_path, chunk_size):
    from tests.comm.mpirun import run_mpi

    expected = reference(source, 8)
    out = tmp_path / "params"
    proc = run_mpi(2, ["-c", NODE_SCRIPT.format(iters=ITERS, chunk=chunk_size), source, str(out)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    for rank in range(2):  # worker g of node k reads records r, r + 4, ... (r = 2k + g): together, batch 8
        params = numpy.load(f"{out}.{rank}.npy")
        for row in params:
            numpy.testing.assert_allclose(row, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("sync,devices,graph", [("host", "0,0", False), ("tree", two_devices(), True)])
def test_two_gpu_workers_match_one_cpu_worker_with_the_whole_batch(source, sync, devices, graph, monkeypatch):
    """``--devices 0,0`` (two workers sharing one GPU) and ``0,1``: the cupy mover's copy stream, events and pinned
    buffers carry the exchange; in tree mode each worker replays its net's body from CUDA graphs. On the emulated
    device the workers get it because this process has it installed (not through the environment)."""
    from layerforge_emulator import install as emulator

    if EMULATED_GPU:
        monkeypatch.delenv(emulator.ENV)
    expected = reference(source, 8)
    d = solver(source, 4, ITERS, cuda_graph=graph)
    d["net_param"]["layers"][1]["convolution"]["engine"] = "IM2COL"  # no AUTO trials: recorded at the first iteration
    result = train_parallel(d, devices=devices, sync=sync, chunk_size=1, log=False)
    assert result.iter == ITERS
    numpy.testing.assert_allclose(result.params[0], expected, rtol=1e-9, atol=1e-11)
    numpy.testing.assert_array_equal(result.params[1], result.params[0])
    phases = result.stats["phases_ms"]
    assert phases["iteration"] > 0 and 0 <= phases["exchange"] < phases["iteration"]  # the exposed exchange


def test_cuda_graphs_are_refused_in_host_mode_in_one_line(source):
    """A replayed backward would post no chunk: every worker would wait for the chunks forever."""
    with pytest.raises(LayerforgeError, match="key 'cuda_graph': cuda_graph cannot record sync host's backward") as e:
        train_parallel(solver(source, 4, ITERS, cuda_graph=True), devices=two_devices(), sync="host", log=False)
    assert "\n" not in str(e.value)


class _Param:
    def __init__(self, shape):
        self.shape, self.count = shape, int(numpy.prod(shape))


@pytest.mark.parametrize("G", [1, 2, 3, 5])
def test_update_shares_cover_every_row_once_in_even_runs(G):
    """CPU replicas split the update by rows: one large parameter (AlexNet's fc6 here) does not make one share large."""
    from layerforge.dataparallel.cgdp.host import update_shares

    params = [_Param(s) for s in [(96, 3, 11, 11), (96,), (4096, 9216), (4096,), (1000, 4096), (1000,), (2,)]]
    shares = update_shares(params, G)
    assert len(shares) == G
    for k, p in enumerate(params):
        owned = numpy.zeros(p.shape[0], int)
        for share in shares:
            if k in share:
                owned[share[k] if share[k] is not None else slice(None)] += 1
        assert (owned == 1).all(), k
    sizes = [sum(p.count if r is None else (r.stop - r.start) * p.count // p.shape[0]
                 for p, r in ((params[k], r) for k, r in share.items())) for share in shares]
    total = sum(p.count for p in params)
    assert max(sizes) - min(sizes) <= 2 * 9216 and sum(sizes) == total  # within a row or two of fc6


@pytest.mark.parametrize("split, expected", [(True, ": 1 threads, OMP_NUM_THREADS=1"),
                                             (False, "OMP_NUM_THREADS=4")])
def test_replicas_share_out_the_threads_the_process_was_given(source, monkeypatch, split, expected):
    # a process told to use 2 threads runs as 2 single-threaded replicas (4 threads on 2 cores spin and halved the
    # replicas' speed); CGDP workers keep a thread setting the user gave them
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "2" if split else "4")
    monkeypatch.setattr("layerforge.kernels.threadpool._state", {"threads": 2, "pool": None})
    with pytest.raises(LayerforgeError, match=expected):
        train_parallel(solver(source, 4, 1000), workers=2, sync="host", split=split, log=False, setup=report_threads)
