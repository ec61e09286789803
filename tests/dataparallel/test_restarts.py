"""`layerforge train --max-restarts`: a job that lost a rank starts again from its last snapshot, the same run bit for
bit on as many ranks; on fewer hosts (the test bed) it keeps the global batch; each rank's own state is in the
snapshot; a user's error or the last allowed failure ends it."""
import json
import os
import re
import shlex
import shutil
import signal

import numpy
import pytest

from layerforge.cli import main as cli_main
from layerforge.comm.testbed import TRANSPORT_ENV, TestBed, down, namespaces, unavailable_reason
from layerforge.dataparallel.restarts import _placement, job_arguments, read_hostfile, smaller_world
from layerforge.errors import LayerforgeError
from tests.comm.mpirun import mpiexec

from .mpijob import Job, cpu_hog, train, under_mpiexec, write_solver  # noqa: F401 - cpu_hog: a fixture

pytestmark = pytest.mark.mpi
RESTARTED = re.compile(r"restart (\d+) of (\d+): (.*); resuming from \S+_iter_(\d+)\.solverstate\.npz .*?"
                       r"(?:on (\d+) ranks?|in one process)(?:, iter_size (\d+))?$", re.M)


def weights(tmp_path, iteration):
    with numpy.load(tmp_path / "snap" / f"net_iter_{iteration}.npz") as f:
        return {k: f[k] for k in f.files}


def run(argv, env=None, timeout=120):
    with Job(argv, env=env) as job:
        code = job.finish(timeout)
    assert code == 0, job.log[-3000:]
    return job.log


def test_a_killed_rank_restarts_the_job_from_its_last_snapshot_bit_for_bit(tmp_path, cpu_hog):
    # 160 iterations: the kill after iteration 12 lands before the job's end (with 40, a fast run had ended once)
    solver = write_solver(tmp_path, max_iter=160, snapshot=10, engine="IM2COL")
    run(under_mpiexec(2, train(solver)))
    expected = weights(tmp_path, 160)
    shutil.rmtree(tmp_path / "snap")
    with Job(train(solver, "--ranks", 2, "--max-restarts", 1)) as job:
        job.wait_for(r"Snapshotting solver state to \S+_iter_10\.")
        job.wait_for(r"Iteration 12 \(")
        victim = job.process(1, "child")
        os.kill(victim, signal.SIGKILL)  # as the out-of-memory killer does
        code = job.finish()
    assert code == 0, job.log[-3000:]
    (restart,) = RESTARTED.findall(job.log)
    assert restart[:2] == ("1", "1") and restart[4] == "2" and not restart[5]
    assert re.fullmatch(rf"rank 1 \(host \S+, pid {victim}\) killed by signal 9 \(SIGKILL\)", restart[2]), restart
    assert int(restart[3]) >= 10 and int(restart[3]) % 10 == 0
    assert job.log.count("Optimization Done.") == 1
    got = weights(tmp_path, 160)
    assert all(numpy.array_equal(got[k], expected[k]) for k in expected)


def test_each_rank_resumes_its_own_engine_choices(tmp_path, monkeypatch):
    """Each rank times AUTO's engines itself and may choose otherwise than rank 0 (here made so by giving each rank an
    engine cache of its own that says so): a resumed job gives every rank its own choices back, bit for bit."""
    solver = write_solver(tmp_path, max_iter=20, snapshot=10)
    caches = [tmp_path / "cache0", tmp_path / "cache1"]
    monkeypatch.setenv("LAYERFORGE_CACHE_DIR", str(caches[0]))
    run(under_mpiexec(2, train(solver, "--max-iter", 7)))  # AUTO settles: the cache has the ranks' layer keys
    shutil.rmtree(tmp_path / "snap")
    chosen = json.loads((caches[0] / "conv_engines.json").read_text())
    for cache, engine in zip(caches, ("IM2COL", "IMPLICIT")):
        cache.mkdir(exist_ok=True)
        mine = {machine: {layer: {d: engine for d in choice} for layer, choice in layers.items()}
                for machine, layers in chosen.items()}
        (cache / "conv_engines.json").write_text(json.dumps(mine))

    def two_caches(*more):
        return [mpiexec(), *(word for rank, cache in enumerate(caches)
                             for word in ([":"] if rank else []) + ["-n", "1", "-env", "LAYERFORGE_CACHE_DIR",
                                                                    str(cache), *train(solver, *more)])]

    run(two_caches())
    expected = weights(tmp_path, 20)
    state = numpy.load(tmp_path / "snap" / "net_iter_10.solverstate.npz")
    replicas = json.loads(state["replicas"].item())
    assert [r["data_state"]["train"]["conv"]["choice"]["forward"] for r in replicas] == ["IM2COL", "IMPLICIT"]
    run(two_caches("--snapshot", tmp_path / "snap" / "net_iter_10.solverstate.npz"))
    got = weights(tmp_path, 20)
    assert all(numpy.array_equal(got[k], expected[k]) for k in expected)


def test_a_snapshot_of_two_ranks_resumes_in_one_process_with_the_global_batch(tmp_path):
    """The rule of a smaller world: iter_size x ranks stays, and each read position moves to the records all ranks
    read, so that (without reshuffling, which deals the records of each shard anew) one process with iter_size 2
    continues two ranks' run (to float rounding: the sums run in another order)."""
    solver = write_solver(tmp_path, max_iter=20, snapshot=10, engine="IM2COL", dtype="FLOAT64", shuffle=False)
    run(under_mpiexec(2, train(solver)))
    expected = weights(tmp_path, 20)
    log = run(train(solver, "--snapshot", tmp_path / "snap" / "net_iter_10.solverstate.npz", "--iter-size", 2))
    assert "was written by 2 replicas, resumed by 1" in log
    got = weights(tmp_path, 20)
    for k in expected:
        numpy.testing.assert_allclose(got[k], expected[k], rtol=1e-9, atol=1e-12, err_msg=k)


_BED = unavailable_reason()


@pytest.mark.skipif(_BED is not None, reason=f"test bed unavailable: {_BED}")
def test_losing_one_host_of_two_restarts_on_what_is_left(tmp_path):
    prefix = f"lfrt{os.getpid()}"
    solver = write_solver(tmp_path, max_iter=40, snapshot=10, engine="IM2COL", dtype="FLOAT64", shuffle=False)
    try:
        with TestBed(2, gbit=10, prefix=prefix) as bed:
            run(bed.mpiexec_command(train(solver)), env=TRANSPORT_ENV)
            expected = weights(tmp_path, 40)
            shutil.rmtree(tmp_path / "snap")
            with Job(train(solver, "--ranks", 2, "--hostfile", bed.hostfile(1), "--mpiexec",
                           shlex.join(bed.mpiexec_prefix()), "--max-restarts", 1, "--min-ranks", 1),
                     env=TRANSPORT_ENV) as job:
                job.wait_for(r"Snapshotting solver state to \S+_iter_10\.")
                job.wait_for(r"Iteration 12 \(")
                bed.crash_host(1)
                code = job.finish()
    finally:
        left = namespaces(prefix)
        down(prefix)
    assert left == []
    assert code == 0, job.log[-3000:]
    (restart,) = RESTARTED.findall(job.log)
    assert f"host {prefix}-h1 lost (ranks 1; " in restart[2], restart
    assert restart[4:] == ("1", "2")  # one rank left: iter_size 2 keeps the global batch of 2 ranks
    got = weights(tmp_path, 40)
    for k in expected:
        numpy.testing.assert_allclose(got[k], expected[k], rtol=1e-9, atol=1e-12, err_msg=k)


def test_ctrl_c_to_the_restarting_parent_stops_the_job_with_a_snapshot(tmp_path):
    """A terminal's Ctrl-C reaches ``layerforge train`` alone (the job leads its own process group: mpiexec getting
    it twice would end the ranks at once), which passes it on once; the job stops with a snapshot, not restarted."""
    with Job(train(write_solver(tmp_path), "--ranks", 2, "--max-restarts", 2)) as job:
        job.wait_for(r"Iteration 3 \(")
        job.signal(signal.SIGINT)
        code = job.finish()
    assert code == 0, job.log[-3000:]
    assert job.log.count("Optimization stopped early.") == 1 and "restart 1" not in job.log
    assert len(list((tmp_path / "snap").glob("*.solverstate.npz"))) == 1


def test_a_users_error_is_not_restarted(tmp_path):
    from layerforge.data.lmdb_io import record_key
    import lmdb

    solver = write_solver(tmp_path, max_iter=40)
    env = lmdb.open(str(tmp_path / "db"), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(record_key(5), b"garbage")  # record 5: rank 1's shard
    env.close()
    with Job(train(solver, "--ranks", 2, "--max-restarts", 3)) as job:
        code = job.finish()
    # exit 2, a user's error (its line "rank 1: error: ..." can be lost when hydra ends the job before passing it on)
    assert code == 2, job.log[-3000:]
    assert "restart 1" not in job.log


def test_one_process_restarts_then_gives_up(tmp_path):
    solver = write_solver(tmp_path, snapshot=10, engine="IM2COL", cpu_parallel="THREADS")
    with Job(train(solver, "--max-restarts", 1)) as job:
        started = job.wait_for(r"Iteration 11 \(")  # the snapshot of iteration 10 is whole
        for attempt in (0, 1):
            victim = job.process(None, "child")
            os.kill(victim, signal.SIGKILL)
            started = job.wait_for(r"Restoring previous" if attempt == 0 else "giving up", after=started.end())
            started = job.wait_for(r"Iteration \d+ \(", after=started.end()) if attempt == 0 else started
        code = job.finish()
    assert code == 128 + signal.SIGKILL
    (restart,) = RESTARTED.findall(job.log)
    assert restart[2].startswith("the job (pid ") and restart[2].endswith("killed by signal 9 (SIGKILL)")
    assert re.search(r"giving up after 1 restart: the job \(pid \d+\) was killed by signal 9 \(SIGKILL\)", job.log)


# ----------------------------------------------------------------------------------------------------------------
# the rules, in this process


def test_a_smaller_world_keeps_the_global_batch():
    assert smaller_world(4, 1, available=2, min_ranks=2) == (2, 2)
    assert smaller_world(4, 1, available=3, min_ranks=1) == (2, 2)  # 3 does not divide 4: two ranks, iter_size 2
    assert smaller_world(4, 2, available=4, min_ranks=4) == (4, 2)
    assert smaller_world(3, 1, available=2, min_ranks=1) == (1, 3)
    assert smaller_world(4, 1, available=1, min_ranks=2) is None
    assert _placement([("a", 2), ("b", 2)], 4) == {"a": "0-1", "b": "2-3"}
    assert _placement([("a", 1), ("b", 1)], 3) == {"a": "0,2", "b": "1"}  # hydra deals past the slots round again


def test_the_job_gets_trains_arguments_without_the_restart_ones():
    argv = ["--solver", "s.yaml", "--ranks", "4", "--max-r", "3", "--weights", "w.npz", "--max-iter", "5",
            "--hostfile=h", "--iter-size", "2", "--min-ranks", "2", "--mpiexec", "mpiexec -launcher ssh"]
    assert job_arguments(argv) == ["--solver", "s.yaml", "--max-iter", "5"]


def test_a_bad_hostfile_names_its_line(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# two hosts\nnode1:2\nnode2:x\n")
    with pytest.raises(LayerforgeError, match=rf"^{re.escape(str(path))}:3: expected 'host' or 'host:slots'"):
        read_hostfile(path)
    path.write_text("node1:2\nnode2 # the other\n")
    assert read_hostfile(path) == [("node1", 2), ("node2", 1)]


def test_restart_options_under_mpiexec_say_what_to_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("LAYERFORGE_SUPERVISED", "1")  # as a rank's child: no supervisor here
    assert cli_main(["train", "--solver", str(write_solver(tmp_path)), "--max-restarts", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --ranks / --max-restarts start mpiexec themselves")
