"""LSTMUnit, LSTM and RNN: Caffe's parameter layout and test cases, cont resets, the state carried across
batches, static input, exposed hidden states, finite-difference gradients, PyTorch's LSTM/RNN as references
(outputs and gradients), and an LSTM that learns a sequence task from configs/examples/lstm_sequence.yaml."""
from pathlib import Path

import numpy
import pytest

from layerforge import Net
from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

RS = numpy.random.RandomState(5)
FILLERS = {"weight_filler": {"type": "uniform", "min": -0.5, "max": 0.5},
           "bias_filler": {"type": "uniform", "min": -0.5, "max": 0.5}}
N_STATES = {"LSTM": 2, "RNN": 1}
EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "examples" / "lstm_sequence.yaml"


def recurrent(type_, hidden=3, expose=False, static=False, xp=numpy, fillers=FILLERS, state_gradients=False):
    bottoms = ["x", "cont"] + (["s"] if static else []) + ([f"h{k}" for k in range(N_STATES[type_])] if expose else [])
    tops = ["y"] + ([f"o{k}" for k in range(N_STATES[type_])] if expose else [])
    return create_layer({"type": type_, "bottom": bottoms, "top": tops,
                         "recurrent": {"num_output": hidden, "expose_hidden": expose,
                                       "state_gradients": state_gradients, **fillers}},
                        dtype=numpy.float64, xp=xp)


def sequence(steps=4, batch=3, dims=(2,), reset_at=2):
    """x (steps, batch, *dims) and cont: 0 at t = 0, and item 1 starts a new sequence at ``reset_at``."""
    cont = numpy.ones((steps, batch))
    cont[0] = 0
    cont[reset_at, 1] = 0
    return RS.randn(steps, batch, *dims), cont


def run(layer, arrays, weights_from=None, xp=numpy):
    """Set up ``layer`` on ``arrays`` (float64) and run it forward; ``weights_from`` a layer whose weights it copies."""
    bottom = [make_blob(a, xp=xp) for a in arrays]
    top = [Blob(dtype=numpy.float64, xp=xp) for _ in layer.layer_param.top]
    layer.setup(bottom, top)
    for mine, theirs in zip(layer.blobs, weights_from.blobs if weights_from else ()):
        mine.data[...] = theirs.data
    layer.forward(bottom, top)
    return bottom, top


def outputs(top):
    return to_numpy(top[0].data).copy()


# -- LSTMUnit -------------------------------------------------------------------------------------

def lstm_unit(xp=numpy):
    return create_layer({"type": "LSTMUnit", "bottom": ["c", "x", "cont"], "top": ["c1", "h1"]},
                        dtype=numpy.float64, xp=xp)


@pytest.mark.parametrize("cont", [[0.0, 0.0, 0.0], [1.0, 0.0, 1.0]])  # Caffe's two LSTMUnit gradient cases
def test_lstm_unit_by_hand_and_gradients(xp, cont):
    c_prev, x = RS.uniform(-1, 1, (1, 3, 2)), RS.uniform(-1, 1, (1, 3, 8))
    cont = numpy.array([cont])
    _, top = run(lstm_unit(xp), [c_prev, x, cont], xp=xp)
    sig = lambda z: 1 / (1 + numpy.exp(-z))  # noqa: E731
    i, f, o, g = sig(x[..., 0:2]), sig(x[..., 2:4]), sig(x[..., 4:6]), numpy.tanh(x[..., 6:8])
    c = cont[..., None] * f * c_prev + i * g
    numpy.testing.assert_allclose(to_numpy(top[0].data), c, rtol=1e-12)
    numpy.testing.assert_allclose(to_numpy(top[1].data), o * numpy.tanh(c), rtol=1e-12)
    check_gradient(lstm_unit(), [make_blob(c_prev), make_blob(x), make_blob(cont)], [Blob(), Blob()],
                   check_bottom=[0, 1])


def test_lstm_unit_cont_zero_drops_the_previous_cell():
    x = RS.randn(1, 2, 4)
    _, a = run(lstm_unit(), [numpy.array([[[5.0], [5.0]]]), x, numpy.array([[0.0, 1.0]])])
    _, b = run(lstm_unit(), [numpy.array([[[-7.0], [5.0]]]), x, numpy.array([[0.0, 1.0]])])
    assert a[0].data[0, 0, 0] == b[0].data[0, 0, 0]  # item 0 starts a sequence: c_prev is ignored
    assert a[0].data[0, 1, 0] == b[0].data[0, 1, 0]
    _, c = run(lstm_unit(), [numpy.array([[[5.0], [-7.0]]]), x, numpy.array([[0.0, 1.0]])])
    assert c[0].data[0, 1, 0] != a[0].data[0, 1, 0]


def test_lstm_unit_shape_mismatch_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"x \(1, N, 4H\)"):
        run(lstm_unit(), [numpy.zeros((1, 3, 2)), numpy.zeros((1, 3, 6)), numpy.zeros((1, 3))])


# -- LSTM and RNN: Caffe's layout and Caffe's tests -----------------------------------------------

@pytest.mark.parametrize("type_,shapes", [
    ("LSTM", [(12, 2), (12,), (12, 3)]), ("RNN", [(3, 2), (3,), (3, 3), (3, 3), (3,)])])
def test_parameter_layout_is_caffes(type_, shapes):
    x, cont = sequence()
    layer = recurrent(type_)
    run(layer, [x, cont])
    assert [b.shape for b in layer.blobs] == shapes
    layer = recurrent(type_, static=True)
    run(layer, [x, cont, RS.randn(3, 5, 2)])
    assert [b.shape for b in layer.blobs] == shapes[:2] + [(shapes[0][0], 10)] + shapes[2:]  # W_*_static third


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_caffe_forward_one_step_at_a_time(type_):
    """Caffe's TestForward: a whole sequence in one batch equals the same fed one step per forward (the
    state is carried from one forward to the next), and with cont 0 at every step only step 0 agrees."""
    gaussian = {"weight_filler": {"type": "gaussian", "std": 0.2}, "bias_filler": {"type": "gaussian", "std": 0.1}}
    x = RS.randn(3, 3, 3, 2)
    cont = (numpy.arange(3) > 0).astype(float)[:, None].repeat(3, axis=1)
    whole = recurrent(type_, hidden=7, fillers=gaussian)
    expected = outputs(run(whole, [x, cont])[1])
    stepper = recurrent(type_, hidden=7, fillers=gaussian)
    bottom, top = run(stepper, [x[:1], cont[:1]], weights_from=whole)
    for t in range(3):
        bottom[0].data[...], bottom[1].data[...] = x[t:t + 1], cont[t:t + 1]
        stepper.forward(bottom, top)
        numpy.testing.assert_allclose(top[0].data[0], expected[t], rtol=1e-12, atol=1e-14)
    flushed = recurrent(type_, hidden=7, fillers=gaussian)
    bottom, top = run(flushed, [x[:1], 0 * cont[:1]], weights_from=whole)
    numpy.testing.assert_allclose(top[0].data[0], expected[0], rtol=1e-12)
    for t in (1, 2):
        bottom[0].data[...] = x[t:t + 1]
        flushed.forward(bottom, top)
        assert (top[0].data[0] != expected[t]).all()


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_carried_state_restarts_when_the_batch_size_changes(type_):
    x, cont = RS.randn(2, 3, 2), numpy.ones((2, 3))
    layer = recurrent(type_)
    _, top = run(layer, [x, cont])
    fresh = outputs(run(recurrent(type_), [x[:, :2], cont[:, :2]], weights_from=layer)[1])
    numpy.testing.assert_allclose(outputs(top)[:, :2], fresh, rtol=1e-14)  # the first forward starts from zeros
    bottom = [make_blob(x[:, :2]), make_blob(cont[:, :2])]
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    numpy.testing.assert_allclose(outputs(top), fresh, rtol=1e-14)
    layer.forward(bottom, top)  # the same batch size again: the state carries
    assert not numpy.allclose(outputs(top), fresh)


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_cont_zero_starts_a_fresh_sequence(type_):
    x, _ = sequence(steps=6, batch=2, dims=(2,))
    cont = numpy.ones((6, 2))
    cont[0] = cont[3] = 0
    layer = recurrent(type_)
    whole = outputs(run(layer, [x, cont])[1])
    second = outputs(run(recurrent(type_), [x[3:], cont[3:]], weights_from=layer)[1])
    numpy.testing.assert_allclose(whole[3:], second, rtol=1e-12)  # nothing from steps 0-2 is carried in
    cont[3] = 1
    assert not numpy.allclose(outputs(run(recurrent(type_), [x, cont], weights_from=layer)[1])[3:], second)


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_exposed_hidden_state_continues_a_sequence(type_):
    x, _ = sequence(steps=6, batch=2, dims=(2,))
    cont = numpy.ones((6, 2))
    cont[0] = 0
    layer = recurrent(type_)
    whole = outputs(run(layer, [x, cont])[1])
    zeros = [numpy.zeros((1, 2, 3))] * N_STATES[type_]
    _, first = run(recurrent(type_, expose=True), [x[:3], cont[:3]] + zeros, weights_from=layer)
    states = [to_numpy(t.data).copy() for t in first[1:]]
    _, second = run(recurrent(type_, expose=True), [x[3:], cont[3:]] + states, weights_from=layer)
    numpy.testing.assert_allclose(numpy.concatenate([outputs(first), outputs(second)]), whole, rtol=1e-12)


def test_rnn_static_input_adds_at_every_step():
    x, cont = sequence(steps=3, batch=2, dims=(2,))
    layer = recurrent("RNN", static=True)
    s = RS.randn(2, 4)
    y = outputs(run(layer, [x, cont, s])[1])
    w_xh, b_h, w_s, w_hh, w_ho, b_o = (b.data for b in layer.blobs)
    h = numpy.zeros((2, 3))
    for t in range(3):
        h = numpy.tanh(x[t] @ w_xh.T + b_h + s @ w_s.T + (cont[t][:, None] * h) @ w_hh.T)
        numpy.testing.assert_allclose(y[t], numpy.tanh(h @ w_ho.T + b_o), rtol=1e-12)


def test_input_without_feature_axes():
    """Caffe takes x (T, N): one input value per step."""
    x, cont = sequence(steps=3, batch=2, dims=())
    layer = recurrent("LSTM")
    y = outputs(run(layer, [x, cont])[1])
    same = outputs(run(recurrent("LSTM"), [x[..., None], cont], weights_from=layer)[1])
    assert layer.blobs[0].shape == (12, 1)
    numpy.testing.assert_allclose(y, same, rtol=1e-14)


# -- gradients and PyTorch ------------------------------------------------------------------------

@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("expose", [False, True])
def test_gradient_check(type_, static, expose):
    x, cont = sequence()
    arrays = [x, cont] + ([RS.randn(3, 2)] if static else [])
    if expose:
        arrays += [RS.randn(1, 3, 3) * 0.5 for _ in range(N_STATES[type_])]
    # the exact gradient, through the exposed states too, needs state_gradients (Caffe passes none there)
    layer = recurrent(type_, expose=expose, static=static, state_gradients=expose)
    tops = [Blob() for _ in layer.layer_param.top]
    checked = [k for k in range(len(arrays)) if k != 1]
    check_gradient(layer, [make_blob(a) for a in arrays], tops, check_bottom=checked)


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_exposed_states_pass_no_gradient_by_default_as_caffe(type_):
    x, cont = sequence()
    cont[:] = 1  # the sequence continues from the given states, so they do influence the outputs
    arrays = [make_blob(a) for a in [x, cont] + [RS.randn(1, 3, 3) for _ in range(N_STATES[type_])]]
    outputs = {}
    for state_gradients in (False, True):
        layer = recurrent(type_, expose=True, state_gradients=state_gradients)
        tops = [Blob(dtype=numpy.float64) for _ in layer.layer_param.top]
        layer.setup(arrays, tops)
        layer.forward(arrays, tops)
        for t in tops:
            t.diff[...] = 1.0
        layer.backward(tops, [True, False] + [True] * N_STATES[type_], arrays)
        outputs[state_gradients] = [b.diff.copy() for b in arrays[2:]]
    assert all((d == 0).all() for d in outputs[False])  # Caffe shares the states' data, not their diffs
    assert all(numpy.abs(d).sum() > 0 for d in outputs[True])


def test_lstm_gradient_caffe_shapes_with_static_input():
    """Caffe's TestGradientNonZeroContBufferSize2WithStaticInput: x (2, 2, 3, 2), x_static (2, 2, 3, 4), H 7."""
    cont = (numpy.arange(4) > 2).astype(float).reshape(2, 2)
    arrays = [RS.uniform(-1, 1, (2, 2, 3, 2)), cont, RS.uniform(-1, 1, (2, 2, 3, 4))]
    layer = recurrent("LSTM", hidden=7, static=True)
    check_gradient(layer, [make_blob(a) for a in arrays], [Blob()], check_bottom=[0, 2], max_checks=40)


def swap_og(a):
    """Caffe's gate blocks i, f, o, g <-> PyTorch's i, f, g, o (the same swap both ways)."""
    i, f, o, g = numpy.split(a, 4)
    return numpy.concatenate([i, f, g, o])


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_matches_torch_outputs_and_gradients(xp, type_):
    torch = pytest.importorskip("torch")
    x, _ = sequence(steps=5, batch=2, dims=(4,))
    cont = numpy.ones((5, 2))
    cont[0] = 0
    gy = RS.randn(5, 2, 3)
    layer = recurrent(type_, xp=xp)
    bottom, top = run(layer, [x, cont], xp=xp)
    top[0].diff[...] = xp.asarray(gy)
    layer.backward(top, [True, False], bottom)
    blobs = [to_numpy(b.data) for b in layer.blobs]
    grads = [to_numpy(b.diff) for b in layer.blobs]
    tx = torch.tensor(x, requires_grad=True)
    if type_ == "LSTM":
        module = torch.nn.LSTM(4, 3).double()
        mine = [swap_og(b) for b in blobs]
    else:
        module = torch.nn.RNN(4, 3, nonlinearity="tanh").double()
        mine = blobs[:3]
    with torch.no_grad():
        for param, value in zip((module.weight_ih_l0, module.bias_ih_l0, module.weight_hh_l0), mine):
            param.copy_(torch.tensor(value))
        module.bias_hh_l0.zero_()
    y, _ = module(tx)
    if type_ == "RNN":  # Caffe's RNN outputs o_t = tanh(W_ho h_t + b_o)
        w_ho, b_o = (torch.tensor(b, requires_grad=True) for b in blobs[3:])
        y = torch.tanh(y @ w_ho.T + b_o)
    (y * torch.tensor(gy)).sum().backward()
    numpy.testing.assert_allclose(outputs(top), y.detach().numpy(), rtol=1e-10, atol=1e-12)
    numpy.testing.assert_allclose(to_numpy(bottom[0].diff), tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    theirs = [module.weight_ih_l0.grad, module.bias_ih_l0.grad, module.weight_hh_l0.grad]
    theirs = [swap_og(t.numpy()) if type_ == "LSTM" else t.numpy() for t in theirs]
    if type_ == "RNN":
        theirs += [w_ho.grad.numpy(), b_o.grad.numpy()]
    for k, (g, t) in enumerate(zip(grads, theirs)):
        numpy.testing.assert_allclose(g, t, rtol=1e-10, atol=1e-12, err_msg=f"blob {k}")


# -- bad input ------------------------------------------------------------------------------------

def test_expose_hidden_counts_are_checked():
    with pytest.raises(ConfigError, match="takes 3 top"):
        create_layer({"type": "LSTM", "bottom": ["x", "c", "h", "c0"], "top": ["y"],
                      "recurrent": {"num_output": 2, "expose_hidden": True}})
    with pytest.raises(ConfigError, match="x, cont, an optional x_static; got 4 bottoms"):
        create_layer({"type": "RNN", "bottom": ["x", "c", "s", "h"], "top": ["y"], "recurrent": {"num_output": 2}})


@pytest.mark.parametrize("arrays,message", [
    ([numpy.zeros((3, 2, 2)), numpy.zeros((3, 1))], r"needs x \(T, N, ...\) and cont \(T, N\)"),
    ([numpy.zeros((3, 2, 2)), numpy.zeros((3, 2)), numpy.zeros((1, 1, 3))], r"initial state h_0 must be \(1, 2, 3\)")])
def test_bad_shapes_are_shape_errors(arrays, message):
    with pytest.raises(ShapeError, match=message):
        run(recurrent("RNN", expose=len(arrays) == 3), arrays)


def test_input_width_change_is_a_shape_error():
    layer = recurrent("LSTM")
    bottom, top = run(layer, [numpy.zeros((3, 2, 2)), numpy.zeros((3, 2))])
    bottom[0].reshape((3, 2, 5))
    with pytest.raises(ShapeError, match=r"x \(3, 2, 5\) has 5 values per item, the weights expect 2"):
        layer.reshape(bottom, top)


# -- nets -----------------------------------------------------------------------------------------

def test_lstm_learns_a_delayed_copy():
    """The net must output the input bit of 2 steps before: impossible without the recurrence."""
    from layerforge.solvers import get_solver

    solver = get_solver({"net": str(EXAMPLE), "type": "Adam", "base_lr": 0.03, "max_iter": 300, "display": 0,
                         "random_seed": 3, "snapshot_after_train": False})
    steps, batch, _ = solver.net.blobs["x"].shape
    delay, rs = 2, numpy.random.RandomState(0)
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
layer { name: "embed" type: "Embed" bottom: "words" top: "e"
  embed_param { num_output: 4 input_dim: 10 weight_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "lstm" type: "LSTM" bottom: "e" bottom: "cont" top: "h"
  recurrent_param { num_output: 3 weight_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "rnn" type: "RNN" bottom: "h" bottom: "cont" top: "o" recurrent_param { num_output: 2 } }
""")
    net = Net(str(path), phase="test")
    cont = numpy.ones((5, 2))
    cont[0] = 0
    out = net.forward(words=numpy.array([[1.0, 2], [3, 4], [5, 6], [7, 8], [9, 0]]), cont=cont)
    assert out["o"].shape == (5, 2, 2)
    assert [b.shape for b in net.params["lstm"]] == [(12, 4), (12,), (12, 3)]
    assert [b.shape for b in net.params["rnn"]] == [(2, 3), (2,), (2, 2), (2, 2), (2,)]
    assert numpy.abs(net.blobs["h"].data).max() > 0
