"""Row gradients (Embed) in the solvers: ``exact`` equals the dense update, ``lazy`` touches only the rows used.

The dense reference is the same model written without Embed: one-hot rows times the table, an
InnerProduct with ``transpose: true`` whose weight is the (V, D) table and whose gradient is dense.
"""
import numpy
import pytest

from layerforge.solvers import get_solver
from layerforge.solvers.seam import Seam

V, D, CLASSES = 9, 4, 3
RULES = [("SGD", {"momentum": 0.9}), ("Nesterov", {"momentum": 0.9}), ("AdaGrad", {}),
         ("RMSProp", {"rms_decay": 0.95}), ("AdaDelta", {"momentum": 0.9, "base_lr": 1.0}),
         ("Adam", {"momentum": 0.9, "momentum2": 0.99})]
# rows 0, 1, 2 then 0, 3, 4 (with repeats)
TWO_STEPS = [(numpy.array([0, 1, 1, 2]), numpy.array([0, 1, 2, 0])),
             (numpy.array([3, 3, 4, 0]), numpy.array([1, 1, 0, 2]))]


def head(bottom):
    return [{"name": "ip", "type": "InnerProduct", "bottom": [bottom], "top": ["ip"],
             "inner_product": {"num_output": CLASSES, "weight_filler": {"type": "GAUSSIAN", "std": 0.5}}},
            {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": ["loss"]}]


def embed_net(batch):
    return {"layers": [
        {"name": "data", "type": "Input", "top": ["x", "label"], "input": {"shape": [[batch], [batch]]}},
        {"name": "embed", "type": "Embed", "bottom": ["x"], "top": ["e"],
         "embed": {"num_output": D, "input_dim": V, "bias_term": False,
                   "weight_filler": {"type": "GAUSSIAN", "std": 0.5}}}] + head("e")}


def one_hot_net(batch):
    return {"layers": [
        {"name": "data", "type": "Input", "top": ["x", "label"], "input": {"shape": [[batch, V], [batch]]}},
        {"name": "embed", "type": "InnerProduct", "bottom": ["x"], "top": ["e"],
         "inner_product": {"num_output": D, "transpose": True, "bias_term": False}}] + head("e")}


def batches(iterations, batch, seed=3):
    # indices from the first 6 rows only, with repeats: rows 6..8 never get a gradient
    g = numpy.random.default_rng(seed)
    return [(g.integers(0, 6, batch), g.integers(0, CLASSES, batch)) for _ in range(iterations)]


def solver(net, data, one_hot=False, **keys):
    s = get_solver({"net_param": net, "dtype": "float64", "random_seed": 1, "base_lr": 0.1, **keys})

    def feed(iteration, pass_index):
        x, label = data[iteration * s.param.iter_size + pass_index]
        return {"x": numpy.eye(V)[x] if one_hot else x.astype(numpy.float64), "label": label}

    s.feed = feed
    return s


def weights(s):
    return [p.data.copy() for p in s.net.learnable_params]


@pytest.mark.parametrize("rule,keys", RULES, ids=[r for r, _ in RULES])
@pytest.mark.parametrize("extra", [{}, {"weight_decay": 0.01}, {"weight_decay": 0.01, "regularization_type": "L1"},
                                   {"clip_gradients": 0.05, "iter_size": 2}],
                         ids=["plain", "l2", "l1", "clip_iter_size"])
def test_exact_row_update_equals_dense_update(rule, keys, extra):
    batch = 5
    data = batches(8, batch)
    sparse = solver(embed_net(batch), data, type=rule, **keys, **extra)
    dense = solver(one_hot_net(batch), data, one_hot=True, type=rule, **keys, **extra)
    for a, b in zip(dense.net.learnable_params, sparse.net.learnable_params):
        a.data[...] = b.data
    sparse.step(4 // sparse.param.iter_size)
    dense.step(4 // dense.param.iter_size)
    for a, b in zip(weights(dense), weights(sparse)):
        numpy.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
    for a, b in zip(dense.history, sparse.history):
        numpy.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("rule,keys", RULES, ids=[r for r, _ in RULES])
def test_lazy_leaves_rows_without_gradient_alone(rule, keys):
    batch = 4
    s = solver(embed_net(batch), TWO_STEPS, type=rule, sparse_update="lazy", weight_decay=0.01, **keys)
    s.step(1)
    table, history = s.net.learnable_params[0].data.copy(), [h.copy() for h in s.history]
    s.step(1)
    n = len(s.net.learnable_params)
    untouched, touched = [1, 2, 5, 6, 7, 8], [0, 3, 4]
    numpy.testing.assert_array_equal(s.net.learnable_params[0].data[untouched], table[untouched])
    assert not numpy.allclose(s.net.learnable_params[0].data[touched], table[touched])
    for k in range(s.history_per_param):
        numpy.testing.assert_array_equal(s.history[k * n][untouched], history[k * n][untouched])


def test_lazy_sgd_by_hand():
    # V_r = m V_r + lr (g_r + wd w_r); w_r -= V_r on the rows r with a gradient; other rows keep w and V
    batch, lr, m, wd = 4, 0.1, 0.9, 0.01
    s = solver(embed_net(batch), TWO_STEPS, type="SGD", sparse_update="lazy", momentum=m, weight_decay=wd, base_lr=lr)
    grads = []

    class Record(Seam):
        def before_update(self):
            grad = s.net.learnable_params[0].sparse_diff()
            grads.append((grad.indices.copy(), grad.rows.copy()))
            return True

    s.add_seam(Record())
    w = s.net.learnable_params[0].data.copy()
    v = numpy.zeros_like(w)
    s.step(2)
    for idx, g in grads:
        v[idx] = m * v[idx] + lr * (g + wd * w[idx])
        w[idx] -= v[idx]
    numpy.testing.assert_array_equal(grads[0][0], [0, 1, 2])
    numpy.testing.assert_array_equal(grads[1][0], [0, 3, 4])
    numpy.testing.assert_allclose(s.net.learnable_params[0].data, w, rtol=1e-13, atol=1e-15)
    numpy.testing.assert_allclose(s.history[0], v, rtol=1e-13, atol=1e-15)


def test_lazy_equals_exact_without_history_or_decay():
    # plain SGD (no momentum, no decay): a row without gradient does not move in either mode
    batch = 5
    data = batches(4, batch)
    lazy = solver(embed_net(batch), data, type="SGD", sparse_update="lazy", clip_gradients=0.05)
    exact = solver(embed_net(batch), data, type="SGD", clip_gradients=0.05)
    lazy.step(4)
    exact.step(4)
    for a, b in zip(weights(exact), weights(lazy)):
        numpy.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-15)


def test_sparse_update_key_is_checked():
    from layerforge.errors import ConfigError
    with pytest.raises(ConfigError, match="sparse_update"):
        get_solver({"net_param": embed_net(2), "sparse_update": "sometimes"})


def test_lazy_adam_equals_torch_sparse_adam():
    # torch.optim.SparseAdam is lazy Adam with Caffe's placement of delta (added to the uncorrected sqrt(v),
    # the correction multiplying the step); the classifier is frozen on both sides (lr_mult 0 / not optimised)
    torch = pytest.importorskip("torch")
    batch, lr, b1, b2, eps = 5, 0.05, 0.9, 0.99, 1e-8
    data = batches(6, batch, seed=11)
    net = embed_net(batch)
    net["layers"][2]["param"] = [{"lr_mult": 0}, {"lr_mult": 0}]
    s = solver(net, data, type="Adam", sparse_update="lazy", base_lr=lr, momentum=b1, momentum2=b2, delta=eps)
    table, ip = (torch.tensor(p.data.copy()) for p in s.net.learnable_params[:2])
    embedding = torch.nn.Embedding(V, D, sparse=True, _weight=table.clone())
    optimizer = torch.optim.SparseAdam(embedding.parameters(), lr=lr, betas=(b1, b2), eps=eps)
    bias = torch.tensor(s.net.learnable_params[2].data.copy())
    for x, label in data:
        optimizer.zero_grad()
        y = embedding(torch.as_tensor(x)) @ ip.T + bias
        torch.nn.functional.cross_entropy(y, torch.as_tensor(label)).backward()
        optimizer.step()
    s.step(len(data))
    numpy.testing.assert_allclose(s.net.learnable_params[0].data, embedding.weight.detach().numpy(), rtol=1e-10,
                                  atol=1e-12)
