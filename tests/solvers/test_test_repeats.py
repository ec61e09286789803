"""A seeded run's test scores repeat: the test net's AUTO convolutions time their engines round-robin over their
first calls (whose results differ in the last bits), so a first run's first test would compute with a mixture of
engines where a later run, finding the choices in the engine cache, computes with the chosen ones. The test phase
settles the engines on scratch arrays before its first batch (autotune.forward_settled), so both score alike."""
import pytest

from layerforge.kernels import blas, engine_cache
from layerforge.kernels.autotune import AutoChoice
from layerforge.solvers import SOLVER_REGISTRY, get_solver, load_solver_param


def solver_param():
    net = {"name": "scored", "layers": [
        {"name": "data", "type": "DummyData", "top": ["x", "label"],
         "dummy_data": {"shape": [[6, 8, 12, 12], [6]], "integer": [False, True],
                        "data_filler": [{"type": "gaussian"}, {"type": "uniform", "min": 0, "max": 3}]}},
        {"name": "conv", "type": "Convolution", "bottom": "x", "top": "conv",
         "convolution": {"num_output": 16, "kernel_size": 3, "weight_filler": {"type": "gaussian", "std": 0.5}}},
        {"name": "ip", "type": "InnerProduct", "bottom": "conv", "top": "ip",
         "inner_product": {"num_output": 3, "weight_filler": {"type": "gaussian", "std": 0.5}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"},
        {"name": "accuracy", "type": "Accuracy", "bottom": ["ip", "label"], "top": "accuracy"}]}
    return load_solver_param({"net_param": net, "base_lr": 0.01, "max_iter": 10, "test_iter": [1],
                              "test_interval": 5, "random_seed": 3, "snapshot_after_train": False},
                             SOLVER_REGISTRY)


@pytest.fixture
def implicit_wins(tmp_path, monkeypatch):
    """A fresh engine cache, and AUTO's timing rigged so that IMPLICIT (timed second) always wins: the first timed
    call, IM2COL's, then computes with another engine than the choice."""
    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    record = AutoChoice.record
    monkeypatch.setattr(AutoChoice, "record",
                        lambda self, name, seconds: record(self, name, 0.5 if name == "IMPLICIT" else 1.0))
    # without batch invariance, where IM2COL's and IMPLICIT's sums differ in the last bits (under it they agree, and
    # tests/net/test_batch_invariance.py checks that a net's outputs never depend on when AUTO chose)
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", False)


def first_test():
    """The scores of a new solver's first test (one batch), and the convolution's output on that batch."""
    solver = get_solver(solver_param())
    scores = solver.test(0)
    return scores, solver.test_nets[0].blobs["conv"].data.copy()


def test_a_test_scores_alike_whether_its_engines_were_timed_now_or_came_from_the_cache(implicit_wins, monkeypatch):
    timed, timed_conv = first_test()
    test_layer = get_solver(solver_param()).test_nets[0].layer_dict["conv"]
    assert test_layer.engine_choice == {"forward": "IMPLICIT", "backward": None}  # read from the cache
    cached, cached_conv = first_test()
    assert timed == cached and timed_conv.tobytes() == cached_conv.tobytes()  # bit for bit

    # without the settling, the first run's first batch is computed by IM2COL, the later runs' by IMPLICIT
    import layerforge.solvers.solver as solver_module

    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, "off")
    monkeypatch.setattr(solver_module, "forward_settled", lambda net, limit=20: net.forward())
    _, mixed_conv = first_test()
    assert mixed_conv.tobytes() != timed_conv.tobytes()
