"""The solver's update runs the blocks of the parameters on the kernel threads, on the host: the same bits for any
thread count and block size; momentum SGD's compiled pass gives the general path's bits."""
import numpy
import pytest

from layerforge.kernels import threadpool as parallel
from layerforge.solvers import get_solver

from .test_snapshot import CONV_NET  # DummyData -> conv1 -> ReLU -> conv2 -> ip -> loss


def trained(solver_type, threads, tmp_path, history=False, **keys):
    parallel.set_num_threads(threads)
    try:
        solver = get_solver(dict(dict(net_param=CONV_NET, type=solver_type, base_lr=0.05, max_iter=4, random_seed=3,
                                      display=0, snapshot_after_train=False, weight_decay=0.01,
                                      snapshot_prefix=str(tmp_path / "s")), **keys))
        solver.solve()
        return [a.tobytes() for a in [p.data for p in solver.net.learnable_params] +
                [p.diff for p in solver.net.learnable_params] + (solver.history if history else [])]
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
    from layerforge.solvers.solver import balanced_groups
    sizes = [100, 1, 60, 50, 2, 3]
    groups = balanced_groups(sizes, 2)
    assert sorted(i for g in groups for i in g) == list(range(6))
    totals = sorted(sum(sizes[i] for i in g) for g in groups)
    assert totals == [106, 110]  # greedy, largest first: 100+3+2+1 and 60+50
    assert balanced_groups(sizes[:2], 5) == [[0], [1]]


# the solvers' compiled passes (kernels/update.py): the module that calls it, the pass, where its decay argument is,
# and the solver's keys
COMPILED_PASSES = {"SGD": ("sgd", "sgd_step", 3, {"momentum": 0.9}),
                   "Nesterov": ("sgd", "nesterov_step", 3, {"momentum": 0.9}),
                   "AdaGrad": ("adagrad", "squared_gradient_step", 3, {"momentum": 0.0}),
                   "RMSProp": ("adagrad", "squared_gradient_step", 3, {"momentum": 0.0, "rms_decay": 0.9}),
                   "AdaDelta": ("adadelta", "adadelta_step", 4, {"momentum": 0.95, "delta": 1e-6}),
                   "Adam": ("adam", "adam_step", 4, {"momentum": 0.9, "momentum2": 0.999})}


@pytest.mark.parametrize("solver_type", sorted(COMPILED_PASSES))
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("keys", [{}, {"momentum": 0.0}, {"weight_decay": 0.0}, {"regularization_type": "L1"}])
def test_compiled_pass_gives_the_passes_bits(solver_type, keys, dtype, tmp_path, monkeypatch):
    """The parameters, their diffs (the step, as Caffe leaves them) and the history after 4 iterations: the same bits
    with the solver's one compiled pass (kernels/update.py) as with regularize, compute_update and the step one after
    the other, for decay_mult 0, 1 and 2 and lr_mult 1 and 2, and momentum 0 (the decay of AdaDelta's means, Adam's
    beta1); L1 decay takes the passes."""
    import importlib

    from layerforge.kernels import update
    from layerforge.solvers import SOLVER_REGISTRY

    module_name, step_name, decay_at, solver_keys = COMPILED_PASSES[solver_type]
    module = importlib.import_module(f"layerforge.solvers.{module_name}")
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    layers = [dict(layer) for layer in CONV_NET["layers"]]
    layers[1]["param"] = [{"lr_mult": 1, "decay_mult": 2}, {"lr_mult": 2, "decay_mult": 0}]  # conv1's weights, bias
    keys = dict(solver_keys, **keys, dtype=numpy.dtype(dtype).name, net_param=dict(CONV_NET, layers=layers))
    calls = []
    step = getattr(update, step_name)
    monkeypatch.setattr(module, step_name, lambda *a: calls.append((a[0].dtype, a[decay_at])) or step(*a))
    fused = trained(solver_type, 2, tmp_path, history=True, **keys)
    assert {t for t, _ in calls} == {numpy.dtype(dtype)}
    if keys.get("regularization_type") == "L1":  # only conv1's bias, decay_mult 0, has the one pass
        assert {decay for _, decay in calls} == {0}
    else:
        assert len({decay for _, decay in calls}) == (1 if keys.get("weight_decay") == 0 else 3)
    monkeypatch.setattr(SOLVER_REGISTRY[solver_type], "fused_update", lambda *a: False)
    assert trained(solver_type, 2, tmp_path, history=True, **keys) == fused


def test_sgd_step_gives_numpys_passes_bits_in_float32():
    """Values whose products and sums round in float32 (not float64, not fused): the passes' bits, in place."""
    from layerforge.kernels.update import sgd_step

    rs = numpy.random.RandomState(0)
    data, diff, history = (rs.randn(3, 1000).astype(numpy.float32) * s for s in (1.0, 1e-3, 1e-2))
    decay, momentum, rate = 5e-4 * 1.3, 0.9, 0.01 * 2
    expected = [a.copy() for a in (data, diff, history)]
    d, g, h = expected
    g += decay * d
    h *= momentum
    h += rate * g
    g[...] = h
    d -= g
    assert sgd_step(data, diff, history, decay, momentum, rate)
    for got, want in zip((data, diff, history), expected):
        numpy.testing.assert_array_equal(got, want)
    wide = numpy.zeros((3, 1000), numpy.float64)
    assert not sgd_step(data, diff, wide, decay, momentum, rate)  # another dtype: the passes do it
    assert not sgd_step(data[:, ::2], diff[:, ::2], history[:, ::2], decay, momentum, rate)


def test_adam_step_gives_numpys_passes_bits_in_float32():
    """Adam's pass: the float32 roundings of the passes (m, v, the step with sqrt and division), in place."""
    from layerforge.kernels.update import adam_step

    rs = numpy.random.RandomState(1)
    data, diff, m = (rs.randn(3, 1000).astype(numpy.float32) * s for s in (1.0, 1e-3, 1e-4))
    v = numpy.abs(rs.randn(3, 1000)).astype(numpy.float32) * 1e-6
    decay, beta1, beta2, step, delta = 5e-4 * 1.3, 0.9, 0.999, 0.001 * 2 * 3.16, 1e-8
    expected = [a.copy() for a in (data, diff, m, v)]
    d, g, m1, v1 = expected
    g += decay * d
    m1[...] = beta1 * m1 + (1.0 - beta1) * g
    v1[...] = beta2 * v1 + (1.0 - beta2) * (g * g)
    g[...] = step * m1 / (numpy.sqrt(v1) + delta)
    d -= g
    assert adam_step(data, diff, m, v, decay, beta1, beta2, step, delta)
    for got, want in zip((data, diff, m, v), expected):
        numpy.testing.assert_array_equal(got, want)
    assert not adam_step(data, diff, m, v.astype(numpy.float64), decay, beta1, beta2, step, delta)
    assert not adam_step(data[:, ::2], diff[:, ::2], m[:, ::2], v[:, ::2], decay, beta1, beta2, step, delta)


def test_a_subclass_that_redefines_a_pass_runs_its_own_passes(tmp_path):
    """A user's solver class that changes a rule's pass (here Adam's compute_update, RMSProp's accumulate) below the
    class with the compiled pass gets its own passes; one that changes nothing, and RMSProp itself (its accumulation,
    from which the passes' accumulate comes), keep the compiled pass."""
    from layerforge.solvers.adam import AdamSolver
    from layerforge.solvers.param import load_solver_param
    from layerforge.solvers.rmsprop import RMSPropSolver
    from layerforge.solvers.solver import SOLVER_REGISTRY

    calls = []

    class ClippedAdam(AdamSolver):
        def compute_update(self, param, state, rate):
            calls.append(param.diff.size)
            super().compute_update(param, state, rate)

    class SlowerRMSProp(RMSPropSolver):
        def accumulate(self, h, g):
            calls.append(g.size)
            super().accumulate(h, g)

    class SameAdam(AdamSolver):
        pass

    for cls, keys, own in ((ClippedAdam, {"type": "Adam"}, True), (SlowerRMSProp, {"type": "RMSProp"}, True),
                           (SameAdam, {"type": "Adam"}, False), (RMSPropSolver, {"type": "RMSProp"}, False)):
        calls.clear()
        sp = load_solver_param(dict(net_param=CONV_NET, base_lr=0.01, max_iter=2, random_seed=3, display=0,
                                    snapshot_after_train=False, snapshot_prefix=str(tmp_path / "s"), **keys),
                               SOLVER_REGISTRY)
        solver = cls(sp)
        solver.step(2)
        assert (sum(calls) == 2 * sum(p.count for p in solver.net.learnable_params)) if own else not calls


def test_a_division_by_zero_in_a_pass_gives_numpys_values():
    """AdaGrad with delta 0 on a zero gradient divides 0 by 0: the compiled pass gives the passes' nan, no
    exception (numba's own division would raise)."""
    from layerforge.kernels.update import squared_gradient_step

    data = numpy.ones(40, numpy.float32)
    diff = numpy.where(numpy.arange(40) % 2, 0.0, 0.5).astype(numpy.float32)
    h = numpy.zeros(40, numpy.float32)
    expected = [a.copy() for a in (data, diff, h)]
    d, g, h1 = expected
    h1 += g * g
    with numpy.errstate(divide="ignore", invalid="ignore"):
        g[...] = 0.1 * g / (numpy.sqrt(h1) + 0.0)
    d -= g
    assert squared_gradient_step(data, diff, h, 0.0, 1.0, 1.0, 0.1, 0.0)
    assert numpy.isnan(diff[1::2]).all() and numpy.isfinite(diff[::2]).all()
    for got, want in zip((data, diff, h), expected):
        numpy.testing.assert_array_equal(got, want)
