"""Recurrent layers: LSTMUnit (one step) and RNN / LSTM over time, unrolled as Caffe's RecurrentLayer does.

Bottoms of RNN and LSTM (Caffe's order): x (T, N, ...) the inputs over time, cont (T, N) the sequence
continuation indicators (0 where a sequence starts: the hidden state from the step before is not carried
in), optionally x_static (N, ...) added at every step, and with ``expose_hidden`` the initial states
(h_0, and c_0 for LSTM, each (1, N, H)). Tops: the outputs over time (T, N, H), and with
``expose_hidden`` the final states. Parameters have Caffe's shapes and order, so Caffe's weights load
by position. Caffe unrolls the recurrence into an internal net of InnerProduct, Eltwise and LSTMUnit
layers; the same computation is written out here, the input projections vectorised over all T steps.
"""
import math

from ..backend import get_array_module
from ..errors import ShapeError
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
    """One LSTM step: c = cont f c_prev + i g, h = o tanh(c), with i, f, o = sigmoid and g = tanh of the
    four quarters of the gate input x (Caffe's order i, f, o, g).

    Bottoms: c_prev (1, N, H), x (1, N, 4H), cont (1, N). Tops: c (1, N, H), h (1, N, H). The
    continuation indicator takes no gradient.
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
    """The parts RNN and LSTM share: Caffe's RecurrentParameter, the bottoms and tops, the projections."""

    param_blocks = {"recurrent": {
        "num_output": Field("int", REQUIRED, min=1, doc="hidden (and output) size H"),
        "weight_filler": Field(FILLER, doc="filler of the weight matrices"),
        "bias_filler": Field(FILLER, doc="filler of the biases"),
        "debug_info": Field("bool", False, doc="Caffe's unrolled-net logging (accepted, no effect)"),
        "expose_hidden": Field("bool", False, doc="initial states as extra bottoms, final states as extra tops"),
    }}
    num_bottom = (2, 5)
    num_top = (1, 3)
    backward_reads = ("bottom",)
    states = ()  # names of the recurrent states (h, or h and c)

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

    def _static(self):
        return len(self.layer_param.bottom) - (len(self.states) if self.layer_param.recurrent.expose_hidden else 0) == 3

    def layer_setup(self, bottom, top):
        p = self.layer_param.recurrent
        self.hidden = p.num_output
        d_in = math.prod(bottom[0].shape[2:])
        self.blobs = self.make_params(d_in, math.prod(bottom[2].shape[1:]) if self._static() else None)

    def reshape(self, bottom, top):
        x, cont = bottom[0].shape, bottom[1].shape
        if len(x) < 3 or tuple(cont) != tuple(x[:2]):
            raise ShapeError(f"needs x (T, N, ...) and cont (T, N), got {x} and {cont}", key="bottom")
        self.steps, self.batch = x[:2]
        if self._static() and bottom[2].shape[0] != self.batch:
            raise ShapeError(f"x_static {bottom[2].shape} needs {self.batch} items", key="bottom")
        state_shape = (1, self.batch, self.hidden)
        if self.layer_param.recurrent.expose_hidden:
            first = 3 if self._static() else 2
            for k, b in enumerate(bottom[first:]):
                if b.shape != state_shape:
                    raise ShapeError(f"initial state {self.states[k]}_0 must be {state_shape}, got {b.shape}",
                                     key="bottom")
            for t in top[1:]:
                t.reshape(state_shape)
        top[0].reshape((self.steps, self.batch, self.out_size()))

    def inputs(self, bottom):
        """x as (T, N, D), x_static as (N, Ds) or None, the initial states, cont as (T, N, 1)."""
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data.reshape(self.steps, self.batch, -1)
        static = bottom[2].data.reshape(self.batch, -1) if self._static() else None
        first = 3 if self._static() else 2
        if self.layer_param.recurrent.expose_hidden:
            init = [b.data.reshape(self.batch, self.hidden) for b in bottom[first:]]
        else:
            init = [xp.zeros((self.batch, self.hidden), dtype=x.dtype) for _ in self.states]
        return x, static, init, bottom[1].data.reshape(self.steps, self.batch, 1)

    def project(self, weight, bias, x):
        """x W^T (+ b) over the last axis."""
        y = x @ weight.T
        return y + bias if bias is not None else y

    def input_grads(self, bottom, propagate_down, dproj, w_in, g_in, g_bias, w_static, g_static):
        """Gradients of the input projections, given d(projection) (T, N, K) summed over the steps."""
        x, static, _, _ = self.inputs(bottom)
        g_in += dproj.reshape(-1, dproj.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        if g_bias is not None:
            g_bias += dproj.sum(axis=(0, 1))
        if propagate_down[0]:
            bottom[0].diff[...] = (dproj @ w_in).reshape(bottom[0].shape)
        if static is not None:
            dsum = dproj.sum(axis=0)
            g_static += dsum.T @ static
            if propagate_down[2]:
                bottom[2].diff[...] = (dsum @ w_static).reshape(bottom[2].shape)

    def state_grads(self, bottom, propagate_down, grads):
        if self.layer_param.recurrent.expose_hidden:
            first = 3 if self._static() else 2
            for k, g in enumerate(grads):
                if propagate_down[first + k]:
                    bottom[first + k].diff[...] = g.reshape(bottom[first + k].shape)

    def top_state_diffs(self, top):
        return [t.diff.reshape(self.batch, self.hidden) for t in top[1:]] if len(top) > 1 else None


@register_layer("LSTM")
class LSTM(_Recurrent):
    """Long short-term memory over T steps: gates = W_xc x_t + b_c (+ W_xc_static x_static) + W_hc (cont_t h_{t-1}),
    then LSTMUnit: c_t = cont_t f c_{t-1} + i g, h_t = o tanh(c_t); the top is h_1..h_T (T, N, H).

    Blobs (Caffe's order): W_xc (4H, D), b_c (4H,), W_xc_static (4H, Ds) with a static input, W_hc (4H, H).
    """

    states = ("h", "c")

    def out_size(self):
        return self.hidden

    def make_params(self, d_in, d_static):
        p, h4 = self.layer_param.recurrent, 4 * self.hidden
        blobs = [self.make_param((h4, d_in), p.weight_filler), self.make_param((h4,), p.bias_filler)]
        if d_static is not None:
            blobs.append(self.make_param((h4, d_static), p.weight_filler))
        return blobs + [self.make_param((h4, self.hidden), p.weight_filler)]

    def forward(self, bottom, top):
        x, static, (h, c), cont = self.inputs(bottom)
        xp = get_array_module(x)
        w_xc, b_c, w_hc = self.blobs[0].data, self.blobs[1].data, self.blobs[-1].data
        gates_in = self.project(w_xc, b_c, x)
        if static is not None:
            gates_in = gates_in + self.project(self.blobs[2].data, None, static)
        self.cache = []
        out = top[0].data
        for t in range(self.steps):
            h_prev = h * cont[t]
            i, f, o, g = lstm_gates(gates_in[t] + h_prev @ w_hc.T)
            c_prev = c
            c = cont[t] * f * c_prev + i * g
            tanh_c = xp.tanh(c)
            h = o * tanh_c
            out[t] = h
            self.cache.append((h_prev, c_prev, i, f, o, g, tanh_c))
        if len(top) > 1:
            top[1].data[...] = h.reshape(top[1].shape)
            top[2].data[...] = c.reshape(top[2].shape)

    def backward(self, top, propagate_down, bottom):
        _, _, _, cont = self.inputs(bottom)
        xp = get_array_module(top[0].diff)
        w_hc = self.blobs[-1].data
        ends = self.top_state_diffs(top)
        dh_next = ends[0].copy() if ends else xp.zeros((self.batch, self.hidden), dtype=top[0].diff.dtype)
        dc_next = ends[1].copy() if ends else xp.zeros_like(dh_next)
        dgates_all = xp.empty((self.steps, self.batch, 4 * self.hidden), dtype=top[0].diff.dtype)
        for t in range(self.steps - 1, -1, -1):
            h_prev, c_prev, i, f, o, g, tanh_c = self.cache[t]
            dh = top[0].diff[t] + dh_next
            dc = dc_next + dh * o * (1 - tanh_c * tanh_c)
            dgates, dc_next = lstm_gate_grads(dc, dh, i, f, o, g, c_prev, tanh_c, cont[t])
            dgates_all[t] = dgates
            self.blobs[-1].diff += dgates.T @ h_prev
            dh_next = (dgates @ w_hc) * cont[t]
        static = self.blobs[2] if self._static() else None
        self.input_grads(bottom, propagate_down, dgates_all, self.blobs[0].data, self.blobs[0].diff,
                         self.blobs[1].diff, static.data if static else None, static.diff if static else None)
        self.state_grads(bottom, propagate_down, [dh_next, dc_next])


@register_layer("RNN")
class RNN(_Recurrent):
    """Elman network over T steps: h_t = tanh(W_xh x_t + b_h (+ W_xh_static x_static) + W_hh (cont_t h_{t-1})),
    o_t = tanh(W_ho h_t + b_o); the top is o_1..o_T (T, N, H).

    Blobs (Caffe's order): W_xh (H, D), b_h (H,), W_xh_static (H, Ds) with a static input, W_hh (H, H),
    W_ho (H, H), b_o (H,).
    """

    states = ("h",)
    backward_reads = ("bottom", "top")

    def out_size(self):
        return self.hidden

    def make_params(self, d_in, d_static):
        p, hid = self.layer_param.recurrent, self.hidden
        blobs = [self.make_param((hid, d_in), p.weight_filler), self.make_param((hid,), p.bias_filler)]
        if d_static is not None:
            blobs.append(self.make_param((hid, d_static), p.weight_filler))
        return blobs + [self.make_param((hid, hid), p.weight_filler), self.make_param((hid, hid), p.weight_filler),
                        self.make_param((hid,), p.bias_filler)]

    def forward(self, bottom, top):
        x, static, (h,), cont = self.inputs(bottom)
        xp = get_array_module(x)
        w_hh, w_ho, b_o = (b.data for b in self.blobs[-3:])
        pre = self.project(self.blobs[0].data, self.blobs[1].data, x)
        if static is not None:
            pre = pre + self.project(self.blobs[2].data, None, static)
        self.cache = []
        for t in range(self.steps):
            h_prev = h * cont[t]
            h = xp.tanh(pre[t] + h_prev @ w_hh.T)
            top[0].data[t] = xp.tanh(self.project(w_ho, b_o, h))
            self.cache.append((h_prev, h))
        if len(top) > 1:
            top[1].data[...] = h.reshape(top[1].shape)

    def backward(self, top, propagate_down, bottom):
        _, _, _, cont = self.inputs(bottom)
        xp = get_array_module(top[0].diff)
        w_hh, w_ho = self.blobs[-3].data, self.blobs[-2].data
        ends = self.top_state_diffs(top)
        dh_next = ends[0].copy() if ends else xp.zeros((self.batch, self.hidden), dtype=top[0].diff.dtype)
        dpre_all = xp.empty((self.steps, self.batch, self.hidden), dtype=top[0].diff.dtype)
        for t in range(self.steps - 1, -1, -1):
            h_prev, h = self.cache[t]
            o = top[0].data[t]
            do = top[0].diff[t] * (1 - o * o)
            self.blobs[-2].diff += do.T @ h
            self.blobs[-1].diff += do.sum(axis=0)
            dpre = (do @ w_ho + dh_next) * (1 - h * h)
            dpre_all[t] = dpre
            self.blobs[-3].diff += dpre.T @ h_prev
            dh_next = (dpre @ w_hh) * cont[t]
        static = self.blobs[2] if self._static() else None
        self.input_grads(bottom, propagate_down, dpre_all, self.blobs[0].data, self.blobs[0].diff,
                         self.blobs[1].diff, static.data if static else None, static.diff if static else None)
        self.state_grads(bottom, propagate_down, [dh_next])
