"""kernels/autotune.ConvEngines on its own, without a layer: the candidates, AUTO's round-robin of timed calls, the
choice, and the state a snapshot keeps."""
import numpy
import pytest

from layerforge.kernels import autotune, engine_cache
from layerforge.kernels.autotune import ConvEngines

GEOMETRY = (3, 3, 1, 1, 1, 1, 1, 1)  # kh, kw, sy, sx, ph, pw, dy, dx


class FakeWatch:
    """A stopwatch whose IMPLICIT calls take half as long as IM2COL's (which engine ran is read from ``ran``)."""

    def __init__(self, ran):
        self.ran = ran

    def start(self):
        pass

    def stop(self):
        return 0.5 if self.ran[-1] == "IMPLICIT" else 1.0


def test_conv_engines_time_round_robin_then_keep_the_fastest(monkeypatch):
    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, "off")
    ran = []
    monkeypatch.setattr(autotune, "Stopwatch", lambda xp: FakeWatch(ran))
    rng = numpy.random.default_rng(0)
    x, W = rng.standard_normal((2, 4, 8, 8)), rng.standard_normal((8, 4, 3, 3))
    engines = ConvEngines("Convolution", "c", "AUTO", GEOMETRY, 1)
    engines.choose(x.shape, (2, 8, 8, 8), W.shape, x.dtype, numpy)
    assert sorted(engines) == ["IM2COL", "IMPLICIT"]  # 4 channels: no Winograd trial
    for name in engines:
        forward = engines[name].forward
        monkeypatch.setattr(engines[name], "forward", lambda *a, name=name, f=forward: (ran.append(name), f(*a)))
    outputs = []
    for _ in range(7):  # (1 warm-up + 2 timed rounds) x 2 engines, then the choice
        y = numpy.zeros((2, 8, 8, 8))
        engines.run("forward", x, W, None, y)
        outputs.append(y)
    assert ran == ["IM2COL", "IMPLICIT"] * 3 + ["IMPLICIT"]
    assert engines.choice == {"forward": "IMPLICIT", "backward": None}
    for y in outputs[1:]:
        numpy.testing.assert_allclose(y, outputs[0], rtol=1e-12, atol=1e-12)

    state = engines.get_state()
    assert state == {"shape": [2, 4, 8, 8], "choice": {"forward": "IMPLICIT", "backward": None},
                     "timing": {"backward": {"calls": 0, "times": {"IM2COL": [], "IMPLICIT": []}, "kept_times": {}}}}
    resumed = ConvEngines("Convolution", "c", "AUTO", GEOMETRY, 1)
    resumed.choose(x.shape, (2, 8, 8, 8), W.shape, x.dtype, numpy)
    resumed.set_state(state)
    assert resumed.choice == engines.choice
    resumed.set_state(dict(state, shape=[4, 4, 8, 8]))  # made for another shape: not taken
    assert resumed.choice == engines.choice


# ms of each engine's calls in each direction, and what a Winograd backward spends deriving again the input tiles
# and filters that its own forward would have kept for it
FORWARD_MS = {"IM2COL": 4.0, "IMPLICIT": 3.0, "WINOGRAD_F2": 1.0, "WINOGRAD": 1.1}
BACKWARD_MS = {"IM2COL": 8.0, "IMPLICIT": 6.0, "WINOGRAD_F2": 2.2, "WINOGRAD": 2.0}


@pytest.mark.parametrize("f2_rederived_ms, f4_rederived_ms, chosen", [
    (0.5, 0.3, ("WINOGRAD_F2", "WINOGRAD_F2")), (0.1, 0.0, ("WINOGRAD_F2", "WINOGRAD")),
    (0.1, 0.3, ("WINOGRAD", "WINOGRAD")), (0.5, 0.8, ("WINOGRAD", "WINOGRAD"))])
def test_the_directions_choose_together_where_forward_keeps_its_tiles_for_backward(monkeypatch, f2_rederived_ms,
                                                                                  f4_rederived_ms, chosen):
    """Each direction is timed alone, so a Winograd backward's trial derives again the tiles and filters that its
    own forward keeps for it in training. F(2,3)'s forward takes 1.0 ms, F(4,3)'s 1.1; F(4,3)'s backward 2.0 beats
    F(2,3)'s 2.2, but after F(2,3)'s forward that one takes 2.2 - 0.5 ms: F(2,3) both ways (1.0 + 1.7) beats F(4,3)
    both ways (1.1 + 1.7) and F(2,3) then F(4,3) (1.0 + 2.0). Where F(2,3)'s backward saves only 0.1 ms and F(4,3)'s
    nothing, F(2,3) then F(4,3); where F(4,3)'s saves 0.3 (or 0.8), F(4,3) both ways, 1.1 + 1.7 (or 1.2)."""
    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, "off")
    ran = []

    class Watch:
        def start(self):
            pass

        def stop(self):
            direction, name = ran[-1]
            return (FORWARD_MS if direction == "forward" else BACKWARD_MS)[name] / 1000

    monkeypatch.setattr(autotune, "Stopwatch", lambda xp: Watch())
    rng = numpy.random.default_rng(1)
    x, W = rng.standard_normal((1, 64, 6, 6)), rng.standard_normal((64, 64, 3, 3))
    engines = ConvEngines("Convolution", "c", "AUTO", GEOMETRY, 1)
    engines.choose(x.shape, (1, 64, 6, 6), W.shape, x.dtype, numpy)
    assert sorted(engines) == ["IM2COL", "IMPLICIT", "WINOGRAD", "WINOGRAD_F2"]
    rederived = {"WINOGRAD_F2": f2_rederived_ms / 1000, "WINOGRAD": f4_rederived_ms / 1000}
    for name, engine in engines.items():
        def forward(*args, name=name, real=engine.forward, **kw):
            ran.append(("forward", name))
            return real(*args, **kw)

        def backward(*args, name=name, engine=engine, real=engine.backward):
            ran.append(("backward", name))
            real(*args)
            if name in rederived:  # the real figure is the host clock's; the test's, fixed
                engine.rederived_seconds = rederived[name]
        monkeypatch.setattr(engine, "forward", forward)
        monkeypatch.setattr(engine, "backward", backward)
    y, gy = numpy.zeros((1, 64, 6, 6)), rng.standard_normal((1, 64, 6, 6))
    while None in engines.choice.values():
        engines.run("forward", x, W, None, y)
        engines.run("backward", x, W, gy, numpy.zeros_like(W), None, numpy.zeros_like(x))
    assert engines.choice == dict(zip(("forward", "backward"), chosen))
    forward = engines[chosen[0]]
    engines.run("forward", x, W, None, y, keep=True)  # a training pass: forward keeps its tiles for its own backward
    assert (forward.kept is not None) == (chosen[0] == chosen[1])
    kept = engines.tuning["backward"].kept_times
    assert {k: 1000 * min(v) for k, v in kept.items()} == pytest.approx(
        {"WINOGRAD_F2": 2.2 - f2_rederived_ms, "WINOGRAD": 2.0 - f4_rederived_ms})


def test_the_kept_times_of_a_direction_still_timing_go_into_the_snapshot_state(monkeypatch):
    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, "off")
    engines = ConvEngines("Convolution", "c", "AUTO", GEOMETRY, 1)
    engines.choose((1, 64, 6, 6), (1, 64, 6, 6), (64, 64, 3, 3), numpy.dtype(numpy.float64), numpy)
    tune = engines.tuning["backward"]
    for name in tune.names * 2:  # the warm-up round, then one timed round
        if name == "WINOGRAD":
            tune.record_kept(name, 0.001)
        tune.record(name, 0.002)
    state = engines.get_state()
    assert state["timing"]["backward"]["kept_times"] == {"WINOGRAD": [0.001]}
    resumed = ConvEngines("Convolution", "c", "AUTO", GEOMETRY, 1)
    resumed.choose((1, 64, 6, 6), (1, 64, 6, 6), (64, 64, 3, 3), numpy.dtype(numpy.float64), numpy)
    resumed.set_state(state)
    assert resumed.tuning["backward"].kept_times == {"WINOGRAD": [0.001]}
    assert resumed.tuning["backward"].calls == tune.calls


def test_conv_engines_named_alone_are_chosen_at_once():
    engines = ConvEngines("Convolution", "c", "IMPLICIT", GEOMETRY, 1)
    engines.choose((1, 2, 5, 5), (1, 3, 5, 5), (3, 2, 3, 3), numpy.dtype(numpy.float64), numpy)
    assert list(engines) == ["IMPLICIT"] and engines.choice == {"forward": "IMPLICIT", "backward": "IMPLICIT"}
    assert engines.get_state()["timing"] == {}


def test_an_engine_over_twice_the_fastest_leaves_the_second_timed_round():
    times = {"IM2COL": 1.0, "IMPLICIT": 0.4, "WINOGRAD": 0.45, "WINOGRAD_F2": 0.81}  # F2 just over 2x
    tune = autotune.AutoChoice(times)
    ran = []
    while tune.choice is None:
        left = tune.calls_left
        name = tune.next()
        ran.append(name)
        tune.record(name, times[name])
        assert tune.calls_left <= left - 1 or tune.choice  # never more calls than it said
    assert ran == list(times) * 2 + ["IMPLICIT", "WINOGRAD"]  # warm-up, the first timed round, then the close two
    assert tune.choice == "IMPLICIT" and tune.next() == "IMPLICIT"
    # the schedule follows from calls and times alone (what a snapshot keeps): cut after any call, it goes on alike
    for cut in range(1, len(ran)):
        resumed = autotune.AutoChoice(times)
        for name in ran[:cut]:
            resumed.record(name, times[name])
        copy = autotune.AutoChoice(times)
        copy.calls, copy.times = resumed.calls, {k: list(v) for k, v in resumed.times.items()}
        rest = []
        while copy.choice is None:
            rest.append(copy.next())
            copy.record(rest[-1], times[rest[-1]])
        assert rest == ran[cut:] and copy.choice == "IMPLICIT"


def test_an_engine_that_wins_its_second_call_still_wins_within_twice():
    tune = autotune.AutoChoice(["A", "B"])
    for name, seconds in [("A", 9), ("B", 9), ("A", 1.0), ("B", 1.9), ("A", 1.0), ("B", 0.5)]:
        assert tune.next() == name
        tune.record(name, seconds)
    assert tune.choice == "B"
