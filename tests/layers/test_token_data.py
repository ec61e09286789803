"""TokenData: truncated-BPTT batches of a token stream, sharded by streams."""
import numpy
import pytest

from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer


def token_layer(source, time_steps=3, batch_size=2, **params):
    """A set-up TokenData layer over the ids in ``source`` (an .npy path) and its three tops."""
    layer = create_layer({"name": "t", "type": "TokenData", "top": ["tokens", "cont", "next"],
                          "token_data": dict(source=str(source), time_steps=time_steps, batch_size=batch_size,
                                             **params)})
    tops = [Blob(), Blob(), Blob()]
    layer.setup([], tops)
    layer.reshape([], tops)
    return layer, tops


def saved(tmp_path, ids):
    path = tmp_path / "ids.npy"
    numpy.save(path, numpy.asarray(ids))
    return path


def batches(layer, tops, k):
    out = []
    for _ in range(k):
        layer.forward([], tops)
        out.append([t.data.copy() for t in tops])
    return out


@pytest.mark.parametrize("T,N", [(3, 2), (1, 1), (4, 3)])
def test_streams_cont_and_targets(tmp_path, T, N):
    layer, tops = token_layer(saved(tmp_path, numpy.arange(60)), T, N)
    length = 60 // N
    for k, (tokens, cont, nxt) in enumerate(batches(layer, tops, 3)):
        assert tokens.shape == cont.shape == nxt.shape == (T, N)
        numpy.testing.assert_array_equal(tokens[:, 0], numpy.arange(k * T, (k + 1) * T))
        for n in range(N):
            assert (tokens[:, n] // length == n).all()  # column n reads stream n
        numpy.testing.assert_array_equal(nxt, tokens + 1)  # each target is the next token of its stream
        assert (cont[1:] == 1).all() and (cont[0] == (0 if k == 0 else 1)).all()


def test_wraps_to_the_start_with_cont_zero(tmp_path):
    layer, tops = token_layer(saved(tmp_path, numpy.arange(20)))  # 2 streams of 10: 3 batches of T + 1 = 4 fit
    seen = batches(layer, tops, 4)
    assert [b[0][0, 0] for b in seen] == [0, 3, 6, 0]
    assert [b[1][0, 0] for b in seen] == [0, 1, 1, 0]


@pytest.mark.parametrize("P", [2, 3])
def test_ranks_read_the_columns_of_one_big_batch(tmp_path, P):
    source = saved(tmp_path, numpy.random.RandomState(0).randint(0, 50, size=300))
    want = batches(*token_layer(source, 3, 2 * P), 4)
    parts = [batches(*token_layer(source, 3, 2, rank=r, world_size=P), 4) for r in range(P)]
    for k in range(4):
        for j in range(3):
            joined = numpy.concatenate([parts[r][k][j] for r in range(P)], axis=1)
            numpy.testing.assert_array_equal(joined, want[k][j])


def test_state_resumes_the_read_position(tmp_path):
    source = saved(tmp_path, numpy.arange(100))
    layer, tops = token_layer(source)
    batches(layer, tops, 2)
    state = layer.get_state()
    after = batches(layer, tops, 2)
    other, tops2 = token_layer(source)
    other.set_state(state)
    for a, b in zip(after, batches(other, tops2, 2)):
        for x, y in zip(a, b):
            numpy.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("params,message", [
    ({"corpus": "pycorpus", "source": "x.npy"}, "exactly one of corpus"),
    ({}, "exactly one of corpus"),
    ({"corpus": "ptb"}, "corpus 'ptb' is not one of pycorpus"),
    ({"corpus": "pycorpus", "split": "valid"}, "split 'valid'"),
    ({"corpus": "pycorpus", "rank": 2, "world_size": 2}, "rank 2 must be less than world_size 2"),
    ({"corpus": "pycorpus", "time_steps": 0}, "time_steps"),
])
def test_bad_parameters_are_one_line(params, message):
    with pytest.raises(ConfigError) as e:
        create_layer({"name": "t", "type": "TokenData", "top": ["a", "b", "c"], "token_data": params})
    assert message in str(e.value) and "\n" not in str(e.value) and "layer 't'" in str(e.value)


def test_bad_sources(tmp_path):
    with pytest.raises(DataError, match="cannot read it as an .npy array"):
        token_layer(tmp_path / "missing.npy")
    with pytest.raises(DataError, match="non-negative integers"):
        token_layer(saved(tmp_path, numpy.ones(10) * 0.5))
    with pytest.raises(DataError, match="fewer than time_steps"):
        token_layer(saved(tmp_path, numpy.arange(5)))
