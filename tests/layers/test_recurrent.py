"""Embed, LSTMUnit, LSTM and RNN: Caffe's parameter layout, cont resets, static input, exposed hidden
states, finite-difference gradients, PyTorch's LSTM/RNN as references, and an LSTM that learns a sequence."""
import numpy
import pytest

from layerforge import Net
from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

RS = numpy.random.RandomState(5)
FILLERS = {"weight_filler": {"type": "uniform", "min": -0.5, "max": 0.5},
           "bias_filler": {"type": "uniform", "min": -0.5, "max": 0.5}}


def recurrent(type_, hidden=3, expose=False, static=False, xp=numpy):
    n_states = {"LSTM": 2, "RNN": 1}[type_]
    bottoms = ["x", "cont"] + (["s"] if static else []) + ([f"h{k}" for k in range(n_states)] if expose else [])
    tops = ["y"] + ([f"o{k}" for k in range(n_states)] if expose else [])
    return create_layer({"type": type_, "bottom": bottoms, "top": tops,
                         "recurrent": {"num_output": hidden, "expose_hidden": expose, **FILLERS}},
                        dtype=numpy.float64, xp=xp)


def sequence(steps=4, batch=3, dims=(2,), reset_at=2):
    cont = numpy.ones((steps, batch))
    cont[0] = 0
    cont[reset_at, 1] = 0  # item 1 starts a new sequence at step 2
    return RS.randn(steps, batch, *dims), cont


# -- Embed ----------------------------------------------------------------------------------------

def test_embed_lookup_and_row_accumulation(xp):
    layer = create_layer({"type": "Embed", "embed": {"num_output": 3, "input_dim": 5, **FILLERS}},
                         dtype=numpy.float64, xp=xp)
    x = numpy.array([[1.0, 4.0, 1.0], [0.0, 1.0, 2.0]])
    bottom, top = [make_blob(x, xp=xp)], [Blob(dtype=numpy.float64, xp=xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    w, b = numpy.asarray(layer.blobs[0].data.tolist()), numpy.asarray(layer.blobs[1].data.tolist())
    numpy.testing.assert_allclose(numpy.asarray(top[0].data.tolist()), w[x.astype(int)] + b)
    gy = RS.randn(2, 3, 3)
    top[0].diff[...] = xp.asarray(gy)
    layer.backward(top, [False], bottom)
    gw = numpy.asarray(layer.blobs[0].diff.tolist())
    numpy.testing.assert_allclose(gw[1], gy[0, 0] + gy[0, 2] + gy[1, 1])
    numpy.testing.assert_allclose(gw[3], 0)
    numpy.testing.assert_allclose(numpy.asarray(layer.blobs[1].diff.tolist()), gy.sum(axis=(0, 1)))


def test_embed_matches_torch_and_gradient_checks():
    torch = pytest.importorskip("torch")
    layer = create_layer({"type": "Embed", "embed": {"num_output": 4, "input_dim": 6, "bias_term": False, **FILLERS}},
                         dtype=numpy.float64)
    x = RS.randint(6, size=(3, 5)).astype(float)
    check_gradient(layer, [make_blob(x)], [Blob()], check_bottom=[])
    w = torch.tensor(layer.blobs[0].data)
    numpy.testing.assert_allclose(torch.nn.functional.embedding(torch.tensor(x, dtype=torch.long), w).numpy(),
                                  layer.blobs[0].data[x.astype(int)])


def test_embed_index_out_of_range_names_the_position():
    layer = create_layer({"type": "Embed", "embed": {"num_output": 2, "input_dim": 3}})
    bottom, top = [make_blob([[0.0, 3.0]])], [Blob()]
    layer.setup(bottom, top)
    with pytest.raises(DataError, match=r"index 3 at position 1 is not an integer in \[0, 3\)"):
        layer.forward(bottom, top)


# -- LSTMUnit -------------------------------------------------------------------------------------

def test_lstm_unit_by_hand_and_gradients(xp):
    c_prev, x = RS.randn(1, 3, 2), RS.randn(1, 3, 8)
    cont = numpy.array([[1.0, 0.0, 1.0]])
    layer = create_layer({"type": "LSTMUnit", "bottom": ["c", "x", "cont"], "top": ["c1", "h1"]},
                         dtype=numpy.float64, xp=xp)
    bottom = [make_blob(a, xp=xp) for a in (c_prev, x, cont)]
    top = [Blob(dtype=numpy.float64, xp=xp), Blob(dtype=numpy.float64, xp=xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    sig = lambda z: 1 / (1 + numpy.exp(-z))  # noqa: E731
    i, f, o, g = sig(x[..., 0:2]), sig(x[..., 2:4]), sig(x[..., 4:6]), numpy.tanh(x[..., 6:8])
    c = cont[..., None] * f * c_prev + i * g
    numpy.testing.assert_allclose(numpy.asarray(top[0].data.tolist()), c, rtol=1e-12)
    numpy.testing.assert_allclose(numpy.asarray(top[1].data.tolist()), o * numpy.tanh(c), rtol=1e-12)
    if xp is numpy:
        check_gradient(create_layer({"type": "LSTMUnit", "bottom": ["c", "x", "cont"], "top": ["c1", "h1"]},
                                    dtype=numpy.float64), [make_blob(c_prev), make_blob(x), make_blob(cont)],
                       [Blob(), Blob()], check_bottom=[0, 1])


# -- LSTM and RNN ---------------------------------------------------------------------------------

@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("expose", [False, True])
def test_recurrent_gradient_check(type_, static, expose):
    x, cont = sequence()
    arrays = [x, cont] + ([RS.randn(3, 2)] if static else [])
    if expose:
        arrays += [RS.randn(1, 3, 3) * 0.5 for _ in range({"LSTM": 2, "RNN": 1}[type_])]
    layer = recurrent(type_, expose=expose, static=static)
    tops = [Blob() for _ in range(1 + (len(layer.states) if expose else 0))]
    checked = [k for k in range(len(arrays)) if k != 1]
    check_gradient(layer, [make_blob(a) for a in arrays], tops, check_bottom=checked)


@pytest.mark.parametrize("type_,shapes", [
    ("LSTM", [(12, 2), (12,), (12, 3)]), ("RNN", [(3, 2), (3,), (3, 3), (3, 3), (3,)])])
def test_parameter_layout_is_caffes(type_, shapes):
    layer = recurrent(type_)
    x, cont = sequence()
    layer.setup([make_blob(x), make_blob(cont)], [Blob()])
    assert [b.shape for b in layer.blobs] == shapes
    layer = recurrent(type_, static=True)
    layer.setup([make_blob(x), make_blob(cont), make_blob(RS.randn(3, 5))], [Blob()])
    assert layer.blobs[2].shape == (shapes[0][0], 5)  # W_x*_static after the input bias


def run(layer, arrays, weights_from=None):
    """Set up and run ``layer`` forward (float64); ``weights_from`` another layer whose weights it copies."""
    bottom = [make_blob(a) for a in arrays]
    top = [Blob(dtype=numpy.float64) for _ in layer.layer_param.top]
    layer.setup(bottom, top)
    for mine, theirs in zip(layer.blobs, weights_from.blobs if weights_from else ()):
        mine.data[...] = theirs.data
    layer.forward(bottom, top)
    return top


def test_lstm_matches_torch():
    torch = pytest.importorskip("torch")
    x, _ = sequence(steps=5, batch=2, dims=(4,))
    cont = numpy.ones((5, 2))
    cont[0] = 0
    layer = recurrent("LSTM", hidden=3)
    top = run(layer, [x, cont])
    w_xc, b_c, w_hc = (b.data for b in layer.blobs)
    reorder = lambda a: numpy.concatenate([a[0:3], a[3:6], a[9:12], a[6:9]])  # noqa: E731  (i,f,o,g -> i,f,g,o)
    lstm = torch.nn.LSTM(4, 3).double()
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.tensor(reorder(w_xc)))
        lstm.weight_hh_l0.copy_(torch.tensor(reorder(w_hc)))
        lstm.bias_ih_l0.copy_(torch.tensor(reorder(b_c)))
        lstm.bias_hh_l0.zero_()
    y, _ = lstm(torch.tensor(x))
    numpy.testing.assert_allclose(top[0].data, y.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_rnn_matches_torch():
    torch = pytest.importorskip("torch")
    x, _ = sequence(steps=5, batch=2, dims=(4,))
    cont = numpy.ones((5, 2))
    cont[0] = 0
    layer = recurrent("RNN", hidden=3)
    top = run(layer, [x, cont])
    w_xh, b_h, w_hh, w_ho, b_o = (torch.tensor(b.data) for b in layer.blobs)
    rnn = torch.nn.RNN(4, 3, nonlinearity="tanh").double()
    with torch.no_grad():
        rnn.weight_ih_l0.copy_(w_xh)
        rnn.weight_hh_l0.copy_(w_hh)
        rnn.bias_ih_l0.copy_(b_h)
        rnn.bias_hh_l0.zero_()
    h, _ = rnn(torch.tensor(x))
    o = torch.tanh(h @ w_ho.T + b_o)
    numpy.testing.assert_allclose(top[0].data, o.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_cont_zero_starts_a_fresh_sequence(type_):
    x, _ = sequence(steps=6, batch=2, dims=(2,))
    cont = numpy.ones((6, 2))
    cont[0] = cont[3] = 0
    layer = recurrent(type_)
    whole = run(layer, [x, cont])[0].data.copy()
    second = run(recurrent(type_), [x[3:], cont[3:]], weights_from=layer)[0].data
    numpy.testing.assert_allclose(whole[3:], second, rtol=1e-12)  # the state from steps 0-2 is not carried in


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_exposed_hidden_state_continues_a_sequence(type_):
    x, _ = sequence(steps=6, batch=2, dims=(2,))
    cont = numpy.ones((6, 2))
    cont[0] = 0
    layer = recurrent(type_)
    whole = run(layer, [x, cont])[0].data.copy()
    exposed = recurrent(type_, expose=True)
    n_states = len(exposed.states)
    zeros = [numpy.zeros((1, 2, 3))] * n_states
    first = run(exposed, [x[:3], cont[:3]] + zeros, weights_from=layer)
    states = [t.data.copy() for t in first[1:]]
    second = run(recurrent(type_, expose=True), [x[3:], cont[3:]] + states, weights_from=layer)
    numpy.testing.assert_allclose(numpy.concatenate([first[0].data, second[0].data]), whole, rtol=1e-12)


def test_expose_hidden_counts_are_checked():
    with pytest.raises(ConfigError, match="takes 3 top"):
        create_layer({"type": "LSTM", "bottom": ["x", "c", "h", "c0"], "top": ["y"],
                      "recurrent": {"num_output": 2, "expose_hidden": True}})


def test_lstm_learns_a_delayed_copy():
    """The net must remember the input bit of 2 steps before: impossible without the recurrence."""
    from layerforge.solvers import get_solver

    steps, batch, delay = 8, 16, 2
    net = {"name": "delay", "layers": [
        {"name": "in", "type": "Input", "top": ["x", "cont", "y"],
         "input": {"shape": [[steps, batch, 1], [steps, batch], [steps, batch, 1]]}},
        {"name": "lstm", "type": "LSTM", "bottom": ["x", "cont"], "top": "h",
         "recurrent": {"num_output": 12, "weight_filler": {"type": "uniform", "min": -0.3, "max": 0.3}}},
        {"name": "out", "type": "InnerProduct", "bottom": "h", "top": "z",
         "inner_product": {"num_output": 1, "axis": 2, "weight_filler": {"type": "xavier"}}},
        {"name": "loss", "type": "SigmoidCrossEntropyLoss", "bottom": ["z", "y"], "top": "loss"}]}
    solver = get_solver({"net_param": net, "type": "Adam", "base_lr": 0.03, "max_iter": 300, "display": 0,
                         "random_seed": 3, "snapshot_after_train": False})
    rs = numpy.random.RandomState(0)
    cont = numpy.ones((steps, batch))
    cont[0] = 0

    def batch_of_bits(iteration, k):
        x = rs.randint(2, size=(steps, batch, 1)).astype(float)
        y = numpy.zeros_like(x)
        y[delay:] = x[:-delay]
        return {"x": x, "cont": cont, "y": y}

    solver.feed = batch_of_bits
    solver.step(300)
    test = batch_of_bits(0, 0)
    solver.net.forward(**test)
    predicted = solver.net.blobs["z"].data[delay:] > 0
    accuracy = float((predicted == (test["y"][delay:] > 0.5)).mean())
    assert accuracy >= 0.97, accuracy


def test_embed_and_lstm_from_prototxt(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text("""name: "lm"
input: "words" input_shape { dim: 5 dim: 2 }
input: "cont" input_shape { dim: 5 dim: 2 }
layer { name: "embed" type: "Embed" bottom: "words" top: "e" embed_param { num_output: 4 input_dim: 10 } }
layer { name: "lstm" type: "LSTM" bottom: "e" bottom: "cont" top: "h" recurrent_param { num_output: 3 } }
layer { name: "rnn" type: "RNN" bottom: "h" bottom: "cont" top: "o" recurrent_param { num_output: 2 } }
""")
    net = Net(str(path), phase="test")
    out = net.forward(words=numpy.array([[1.0, 2], [3, 4], [5, 6], [7, 8], [9, 0]]), cont=numpy.ones((5, 2)))
    assert out["o"].shape == (5, 2, 2)
    assert [b.shape for b in net.params["lstm"]] == [(12, 4), (12,), (12, 3)]
