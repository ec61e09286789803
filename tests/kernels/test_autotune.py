"""kernels/autotune.ConvEngines on its own, without a layer: the candidates, AUTO's round-robin of timed calls, the
choice, and the state a snapshot keeps."""
import numpy

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
                     "timing": {"backward": {"calls": 0, "times": {"IM2COL": [], "IMPLICIT": []}}}}
    resumed = ConvEngines("Convolution", "c", "AUTO", GEOMETRY, 1)
    resumed.choose(x.shape, (2, 8, 8, 8), W.shape, x.dtype, numpy)
    resumed.set_state(state)
    assert resumed.choice == engines.choice
    resumed.set_state(dict(state, shape=[4, 4, 8, 8]))  # made for another shape: not taken
    assert resumed.choice == engines.choice


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
