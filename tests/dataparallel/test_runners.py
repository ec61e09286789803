"""`layerforge train`'s one entrance: the runner it picks, and the solver file read and normalised once."""
import argparse
import functools

import pytest

from layerforge.dataparallel import cpu_parallel, restarts, runners
from layerforge.solvers import SOLVER_REGISTRY, load_solver_param
from tests.dataparallel.cgdp.helpers import SMALL_NET


@pytest.fixture
def solver_file(tmp_path):
    (tmp_path / "net.yaml").write_text(SMALL_NET)
    path = tmp_path / "solver.yaml"
    path.write_text("net: net.yaml\nbase_lr: 0.01\nmax_iter: 2\nsnapshot_after_train: false\n"
                    f"snapshot_prefix: {tmp_path / 'snap'}\n")
    return path


@pytest.mark.parametrize("asked, keys, under_mpiexec, want", [
    (dict(max_restarts=1), {}, False, runners.train_restarting),
    (dict(ranks=2), {}, False, runners.train_restarting),
    ({}, {"max_restarts": 2}, False, runners.train_restarting),
    (dict(workers=2), {}, False, runners.train_workers),
    (dict(devices="0,1"), {}, True, runners.train_workers),
    ({}, {}, True, runners.train_ranks),
    (dict(cpu_parallel="THREADS"), {}, False, runners.train_one),
    ({}, {"solver_mode": "GPU"}, False, runners.train_one),
    (dict(cpu_parallel="REPLICAS"), {}, False, runners.train_replicas),
])
def test_the_entrance_picks_one_runner(monkeypatch, solver_file, asked, keys, under_mpiexec, want):
    monkeypatch.delenv(restarts.RESTART_ENV, raising=False)
    monkeypatch.setattr(cpu_parallel, "cores", lambda: 2)
    sp = load_solver_param(str(solver_file), SOLVER_REGISTRY, **keys)
    rank = runners.Rank(comm=None, requests=[]) if under_mpiexec else None
    runner = runners.runner_for(runners.TrainRun(**asked), sp, rank)
    if want is runners.train_replicas:
        assert isinstance(runner, functools.partial) and runner.func is want and runner.keywords == {"replicas": 2}
    else:
        assert runner is want


def test_train_with_workers_reads_and_normalises_the_solver_once(monkeypatch, solver_file):
    """Before the one entrance, `train --workers 2 --sync host` read the file twice and validated it three times."""
    from layerforge.commands import train
    from layerforge.solvers import param

    reads, checks = [], []
    read, check = param.read_solver_file, param._check
    monkeypatch.setattr(param, "read_solver_file", lambda path: reads.append(path) or read(path))
    monkeypatch.setattr(param, "_check", lambda sp, registry: checks.append(sp) or check(sp, registry))
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--solver", str(solver_file), "--workers", "2", "--sync", "host", "--max-iter", "1",
                              "--no-progress"])
    assert train.run(args) == 0
    assert reads == [str(solver_file)]
    assert len(checks) == 1 and checks[0].sync == "HOST" and checks[0].max_iter == 1
