"""Recurrent layers: LSTMUnit (one step) and RNN / LSTM over time, unrolled as Caffe's RecurrentLayer does.

Bottoms of RNN and LSTM (Caffe's order): x (T, N, ...) the inputs over time, cont (T, N) the sequence
continuation indicators (0 where a sequence starts: the state from the step before is not carried in),
optionally x_static (N, ...) added at every step, and with ``expose_hidden`` the initial states (h_0, and
c_0 for LSTM, each (1, N, H)). Tops: the outputs over time (T, N, H), and with ``expose_hidden`` the final
states. Without ``expose_hidden`` the final states of one forward are the initial states of the next, as
in Caffe (a stream may go on across batches while cont stays 1; no gradient crosses batches). Parameters
have Caffe's shapes and order, so Caffe's weights load by position. Caffe unrolls the recurrence into an
internal net of InnerProduct, Eltwise and LSTMUnit layers; the same computation is written out here, the
input projections vectorised over all T steps.
"""
import math

from ..backend import get_array_module
from ..errors import ShapeError
from ..kernels.blas import add_matmul, matmul
from ..schema import REQUIRED
from .base import FILLER, Field, Layer, register_layer


def _sigmoid(z):
    return 0.5 * get_array_module(z).tanh(0.5 * z) + 0.5


def lstm_gates(gates):
    """Split pre-activations (..., 4H) into i, f, o (sigmoid) and g (tanh), Caffe's gate order."""
    h = gates.shape[-1] // 4
    xp = get_array_module(gates)
    return (_sigmoid(gates[..., :h]), _sigmoid(gates[..., h:2 * h]), _sigmoid(gates[..., 2 * h:3 * h]),
            xp.tanh(gates[..., 3 * h:]))


def lstm_gate_grads(dc, dh, i, f, o, g, c_prev, tanh_c, cont):
    """Gradients of one LSTM step: (d pre-activations (..., 4H), dc_prev); dc already includes dh's share."""
    xp = get_array_module(dc)
    di, df, do, dg = dc * g, dc * c_prev * cont, dh * tanh_c, dc * i
    dgates = xp.concatenate([di * i * (1 - i), df * f * (1 - f), do * o * (1 - o), dg * (1 - g * g)], axis=-1)
    return dgates, dc * f * cont


@register_layer("LSTMUnit")
class LSTMUnit(Layer):
    """One LSTM step from given gate inputs: c = cont f c_prev + i g, h = o tanh(c).

    x holds the four gate pre-activations side by side in Caffe's order i, f, o, g (H each):
    i, f, o = sigmoid and g = tanh of their quarter. cont (0 or 1) drops c_prev where a sequence starts.
    Bottoms: c_prev (1, N, H), x (1, N, 4H), cont (1, N). Tops: c (1, N, H), h (1, N, H).
    Backward: dc = gc + gh o (1 - tanh(c)^2), gc_prev = cont f dc, gi = dc g, gf = cont dc c_prev,
    go = gh tanh(c), gg = dc i, each times its activation's derivative; cont takes no gradient.
    """

    num_bottom = (3, 3)
    num_top = (2, 2)
    backward_reads = ("bottom", "top")

    def allow_force_backward(self, bottom_index):
        return bottom_index < 2

    def reshape(self, bottom, top):
        c_prev, x, cont = (b.shape for b in bottom)
        if x[:-1] != c_prev[:-1] or x[-1] != 4 * c_prev[-1] or math.prod(cont) != math.prod(c_prev[:-1]):
            raise ShapeError(f"needs c_prev (1, N, H), x (1, N, 4H) and cont (1, N), got {c_prev}, {x} and {cont}",
                             key="bottom")
        top[0].reshape(c_prev)
        top[1].reshape(c_prev)

    def forward(self, bottom, top):
        c_prev, x = bottom[0].data, bottom[1].data
        cont = bottom[2].data.reshape(c_prev.shape[:-1] + (1,))
        i, f, o, g = lstm_gates(x)
        c = cont * f * c_prev + i * g
        top[0].data[...] = c
        top[1].data[...] = o * get_array_module(c).tanh(c)

    def backward(self, top, propagate_down, bottom):
        c_prev, x = bottom[0].data, bottom[1].data
        cont = bottom[2].data.reshape(c_prev.shape[:-1] + (1,))
        i, f, o, g = lstm_gates(x)
        tanh_c = get_array_module(c_prev).tanh(top[0].data)
        dh = top[1].diff
        dc = top[0].diff + dh * o * (1 - tanh_c * tanh_c)
        dgates, dc_prev = lstm_gate_grads(dc, dh, i, f, o, g, c_prev, tanh_c, cont)
        if propagate_down[0]:
            bottom[0].diff[...] = dc_prev
        if propagate_down[1]:
            bottom[1].diff[...] = dgates


class _Recurrent(Layer):
    """What RNN and LSTM share: Caffe's RecurrentParameter, the bottoms and tops, the input projections, the
    loops over time. A subclass gives ``states``, ``gates`` (pre-activations per hidden unit) and one step
    forward and backward."""

    param_blocks = {"recurrent": {
        "num_output": Field("int", REQUIRED, min=1, doc="hidden (and output) size H"),
        "weight_filler": Field(FILLER, doc="filler of the weight matrices"),
        "bias_filler": Field(FILLER, doc="filler of the biases"),
        "debug_info": Field("bool", False, doc="Caffe's unrolled-net logging (accepted, no effect)"),
        "expose_hidden": Field("bool", False, doc="initial states as extra bottoms, final states as extra tops"),
        "state_gradients": Field("bool", False, doc="layerforge: with expose_hidden, gradients flow from the final "
                                                    "states and into the initial ones (Caffe passes neither)"),
    }}
    num_bottom = (2, 5)
    num_top = (1, 3)
    backward_reads = ("bottom",)
    states = ()  # names of the recurrent states (h, or h and c)
    gates = 1

    @classmethod
    def validate_params(cls, lp):
        n_states = len(cls.states)
        expose = lp.recurrent.expose_hidden
        tops = 1 + (n_states if expose else 0)
        if len(lp.top) != tops:
            raise lp.error(f"takes {tops} top(s) with expose_hidden {str(expose).lower()}, got {len(lp.top)}", "top")
        bottoms = len(lp.bottom) - (n_states if expose else 0)
        if bottoms not in (2, 3):
            raise lp.error(f"takes x, cont, an optional x_static{' and the initial states' if expose else ''}; "
                           f"got {len(lp.bottom)} bottoms", "bottom")

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1  # cont

    def layer_setup(self, bottom, top):
        p = self.layer_param.recurrent
        self.hidden, self.expose = p.num_output, p.expose_hidden
        self.static = len(bottom) - (len(self.states) if self.expose else 0) == 3
        self.first_state = 3 if self.static else 2
        self.carry = None  # the final states of the last forward: the next forward's initial states
        d_static = math.prod(bottom[2].shape[1:]) if self.static else None
        self.blobs = self.make_params(math.prod(bottom[0].shape[2:]), d_static)

    def make_params(self, d_in, d_static):
        """W_x (gH, D), b (gH,), W_static (gH, Ds) with a static input, W_h (gH, H): Caffe's order."""
        p, width = self.layer_param.recurrent, self.gates * self.hidden
        blobs = [self.make_param((width, d_in), p.weight_filler), self.make_param((width,), p.bias_filler)]
        if d_static is not None:
            blobs.append(self.make_param((width, d_static), p.weight_filler))
        return blobs + [self.make_param((width, self.hidden), p.weight_filler)]

    def reshape(self, bottom, top):
        x, cont = bottom[0].shape, bottom[1].shape
        if len(x) < 2 or tuple(cont) != tuple(x[:2]):
            raise ShapeError(f"needs x (T, N, ...) and cont (T, N), got {x} and {cont}", key="bottom")
        self.steps, self.batch = x[:2]
        inputs = [("x", x, math.prod(x[2:]), self.blobs[0].shape[1])]
        if self.static:
            s = bottom[2].shape
            if s[0] != self.batch:
                raise ShapeError(f"x_static {s} needs {self.batch} items", key="bottom")
            inputs.append(("x_static", s, math.prod(s[1:]), self.blobs[2].shape[1]))
        for name, shape, got, want in inputs:
            if got != want:
                raise ShapeError(f"{name} {shape} has {got} values per item, the weights expect {want}", key="bottom")
        state_shape = (1, self.batch, self.hidden)
        if self.expose:
            for name, b in zip(self.states, bottom[self.first_state:]):
                if tuple(b.shape) != state_shape:
                    raise ShapeError(f"initial state {name}_0 must be {state_shape}, got {b.shape}", key="bottom")
            for t in top[1:]:
                t.reshape(state_shape)
        top[0].reshape((self.steps, self.batch, self.hidden))

    def inputs(self, bottom):
        """x as (T, N, D), x_static as (N, Ds) or None, cont as (T, N, 1)."""
        x = bottom[0].data.reshape(self.steps, self.batch, -1)
        static = bottom[2].data.reshape(self.batch, -1) if self.static else None
        return x, static, bottom[1].data.reshape(self.steps, self.batch, 1)

    def initial_states(self, bottom):
        if self.expose:
            return [b.data.reshape(self.batch, self.hidden) for b in bottom[self.first_state:]]
        shape = (self.batch, self.hidden)
        if self.carry is not None and self.carry[0].shape == shape:
            return self.carry
        xp = get_array_module(bottom[0].data)
        return [xp.zeros(shape, dtype=bottom[0].data.dtype) for _ in self.states]

    def forward(self, bottom, top):
        x, static, cont = self.inputs(bottom)
        projected = matmul(x, self.blobs[0].data.T) + self.blobs[1].data
        if static is not None:
            projected = projected + matmul(static, self.blobs[2].data.T)
        states = self.initial_states(bottom)
        self.cache = []
        for t in range(self.steps):
            top[0].data[t], states = self.step(projected[t], states, cont[t])
        if self.expose:
            for blob, state in zip(top[1:], states):
                blob.data[...] = state.reshape(blob.shape)
        else:
            self.carry = states

    def backward(self, top, propagate_down, bottom):
        x, static, cont = self.inputs(bottom)
        xp = get_array_module(x)
        gy = top[0].diff
        if self.expose and self.layer_param.recurrent.state_gradients:
            ends = [blob.diff.reshape(self.batch, self.hidden) for blob in top[1:]]
        else:  # Caffe shares only the states' data with the exposed blobs: their diffs never meet the recurrence
            ends = [xp.zeros((self.batch, self.hidden), dtype=gy.dtype) for _ in self.states]
        dprojected = xp.empty((self.steps, self.batch, self.gates * self.hidden), dtype=gy.dtype)
        for t in range(self.steps - 1, -1, -1):
            dprojected[t], ends = self.step_backward(t, gy[t], ends, cont[t])
        w_in, b_in = self.blobs[0], self.blobs[1]
        add_matmul(w_in.diff, dprojected.reshape(-1, dprojected.shape[-1]).T, x.reshape(-1, x.shape[-1]))
        b_in.diff += dprojected.sum(axis=(0, 1))
        if propagate_down[0]:
            bottom[0].diff[...] = matmul(dprojected, w_in.data).reshape(bottom[0].shape)
        if static is not None:
            dsum = dprojected.sum(axis=0)
            add_matmul(self.blobs[2].diff, dsum.T, static)
            if propagate_down[2]:
                bottom[2].diff[...] = matmul(dsum, self.blobs[2].data).reshape(bottom[2].shape)
        if self.expose:
            state_gradients = self.layer_param.recurrent.state_gradients
            for k, g in enumerate(ends, start=self.first_state):
                if propagate_down[k]:
                    bottom[k].diff[...] = g.reshape(bottom[k].shape) if state_gradients else 0


@register_layer("LSTM")
class LSTM(_Recurrent):
    """Long short-term memory over T steps, Caffe's LSTM layer: the top is h_1..h_T (T, N, H).

    At each step gates = W_xc x_t + b_c (+ W_xc_static x_static) + W_hc (cont_t h_{t-1}), then LSTMUnit:
    c_t = cont_t f c_{t-1} + i g, h_t = o tanh(c_t) with i, f, o, g the gates' quarters in that order.
    Blobs (Caffe's order): W_xc (4H, D), b_c (4H,), W_xc_static (4H, Ds) with a static input, W_hc (4H, H).
    With ``expose_hidden``: bottoms h_0, c_0 and tops h_T, c_T, each (1, N, H); as in Caffe no gradient
    flows from h_T, c_T or into h_0, c_0 unless ``state_gradients`` (layerforge) asks for it.
    """

    states = ("h", "c")
    gates = 4

    def step(self, projected, states, cont):
        h, c_prev = states
        h_prev = h * cont
        i, f, o, g = lstm_gates(projected + matmul(h_prev, self.blobs[-1].data.T))
        c = cont * f * c_prev + i * g
        tanh_c = get_array_module(c).tanh(c)
        h = o * tanh_c
        self.cache.append((h_prev, c_prev, i, f, o, g, tanh_c))
        return h, (h, c)

    def step_backward(self, t, gy, ends, cont):
        h_prev, c_prev, i, f, o, g, tanh_c = self.cache[t]
        dh = gy + ends[0]
        dc = ends[1] + dh * o * (1 - tanh_c * tanh_c)
        dgates, dc_prev = lstm_gate_grads(dc, dh, i, f, o, g, c_prev, tanh_c, cont)
        w_hc = self.blobs[-1]
        add_matmul(w_hc.diff, dgates.T, h_prev)
        return dgates, (matmul(dgates, w_hc.data) * cont, dc_prev)


@register_layer("RNN")
class RNN(_Recurrent):
    """Elman network over T steps, Caffe's RNN layer: the top is o_1..o_T (T, N, H).

    At each step h_t = tanh(W_xh x_t + b_h (+ W_xh_static x_static) + W_hh (cont_t h_{t-1})) and
    o_t = tanh(W_ho h_t + b_o).
    Blobs (Caffe's order): W_xh (H, D), b_h (H,), W_xh_static (H, Ds) with a static input, W_hh (H, H),
    W_ho (H, H), b_o (H,). With ``expose_hidden``: bottom h_0 and top h_T, (1, N, H); as in Caffe no
    gradient flows from h_T or into h_0 unless ``state_gradients`` (layerforge) asks for it.
    """

    states = ("h",)

    def make_params(self, d_in, d_static):
        p = self.layer_param.recurrent
        return super().make_params(d_in, d_static) + [
            self.make_param((self.hidden, self.hidden), p.weight_filler),
            self.make_param((self.hidden,), p.bias_filler)]

    def step(self, projected, states, cont):
        xp = get_array_module(projected)
        h_prev = states[0] * cont
        h = xp.tanh(projected + matmul(h_prev, self.blobs[-3].data.T))
        o = xp.tanh(matmul(h, self.blobs[-2].data.T) + self.blobs[-1].data)
        self.cache.append((h_prev, h, o))
        return o, (h,)

    def step_backward(self, t, gy, ends, cont):
        h_prev, h, o = self.cache[t]
        w_hh, w_ho, b_o = self.blobs[-3:]
        do = gy * (1 - o * o)
        add_matmul(w_ho.diff, do.T, h)
        b_o.diff += do.sum(axis=0)
        dpre = (matmul(do, w_ho.data) + ends[0]) * (1 - h * h)
        add_matmul(w_hh.diff, dpre.T, h_prev)
        return dpre, (matmul(dpre, w_hh.data) * cont,)
