"""The solver's update runs whole parameters on the kernel threads, each in blocks on the host: the same bits
for any thread count and block size."""
import pytest

from layerforge.kernels import threadpool as parallel
from layerforge.solvers import get_solver

from .test_snapshot import CONV_NET  # DummyData -> conv1 -> ReLU -> conv2 -> ip -> loss


def trained(solver_type, threads, tmp_path, **keys):
    parallel.set_num_threads(threads)
    try:
        solver = get_solver(dict(net_param=CONV_NET, type=solver_type, base_lr=0.05, max_iter=4, random_seed=3,
                                 display=0, snapshot_after_train=False, weight_decay=0.01,
                                 snapshot_prefix=str(tmp_path / "s"), **keys))
        solver.solve()
        return [p.data.tobytes() for p in solver.net.learnable_params]
    finally:
        parallel.set_num_threads(None)


@pytest.mark.parametrize("solver_type,keys", [("SGD", {"momentum": 0.9}), ("Nesterov", {"momentum": 0.9}),
                                             ("AdaGrad", {}), ("RMSProp", {"rms_decay": 0.9}),
                                             ("AdaDelta", {"momentum": 0.95, "delta": 1e-6}),
                                             ("Adam", {"momentum": 0.9, "momentum2": 0.999})])
def test_update_is_bit_identical_for_any_thread_count_and_block(solver_type, keys, tmp_path, monkeypatch):
    from layerforge.solvers import solver

    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    one = trained(solver_type, 1, tmp_path, **keys)
    for threads in (2, 3):
        assert trained(solver_type, threads, tmp_path, **keys) == one
    for block in (1, 7, 64):  # the update of a parameter in blocks of this many elements: the same bits
        monkeypatch.setattr(solver, "UPDATE_BLOCK", block)
        assert trained(solver_type, 2, tmp_path, **keys) == one


def test_groups_balance_sizes():
    from types import SimpleNamespace

    from layerforge.solvers.solver import balanced_groups
    params = [SimpleNamespace(count=c) for c in (100, 1, 60, 50, 2, 3)]
    groups = balanced_groups(range(6), params, 2)
    assert sorted(i for g in groups for i in g) == list(range(6))
    totals = sorted(sum(params[i].count for i in g) for g in groups)
    assert totals == [106, 110]  # greedy, largest first: 100+3+2+1 and 60+50
    assert balanced_groups([0, 1], params, 5) == [[0], [1]]
