"""Embed: lookup by integer indices, rows of the weight gradient accumulated where an index repeats, the
bias, bad indices as one line, PyTorch's embedding as a reference, and a Caffe prototxt that converts."""
import numpy
import pytest

from layerforge import Net
from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import DataError
from layerforge.layers import create_layer
from layerforge.layers.embed import embedding_rows
from layerforge.testing import check_gradient, make_blob

RS = numpy.random.RandomState(7)
UNIFORM = {"type": "uniform", "min": -1, "max": 1}


def embed(num_output=3, input_dim=5, bias_term=True, xp=numpy):
    return create_layer({"type": "Embed", "embed": {"num_output": num_output, "input_dim": input_dim,
                                                    "bias_term": bias_term, "weight_filler": UNIFORM,
                                                    "bias_filler": UNIFORM}}, dtype=numpy.float64, xp=xp)


def forward_backward(layer, x, gy, xp):
    bottom, top = [make_blob(x, xp=xp)], [Blob(dtype=numpy.float64, xp=xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    y = to_numpy(top[0].data).copy()
    top[0].diff[...] = xp.asarray(gy)
    layer.backward(top, [False], bottom)
    return y, [to_numpy(p.diff).copy() for p in layer.blobs]


@pytest.mark.parametrize("shape", [(6,), (2, 3), (2, 2, 3)])
@pytest.mark.parametrize("bias_term", [True, False])
def test_lookup_and_gradients_by_hand(xp, shape, bias_term):
    layer = embed(bias_term=bias_term, xp=xp)
    x = RS.randint(5, size=shape).astype(float)
    x.reshape(-1)[:2] = 4  # an index that repeats
    gy = RS.randn(*shape, 3)
    y, grads = forward_backward(layer, x, gy, xp)
    w = to_numpy(layer.blobs[0].data)
    b = to_numpy(layer.blobs[1].data) if bias_term else 0
    assert y.shape == shape + (3,)
    flat_x, flat_gy = x.reshape(-1).astype(int), gy.reshape(-1, 3)
    for n, k in enumerate(flat_x):
        numpy.testing.assert_allclose(y.reshape(-1, 3)[n], w[k] + b, rtol=1e-14)
    for k in range(5):
        numpy.testing.assert_allclose(grads[0][k], flat_gy[flat_x == k].sum(axis=0), rtol=1e-12, atol=1e-14)
    if bias_term:
        numpy.testing.assert_allclose(grads[1], flat_gy.sum(axis=0), rtol=1e-12)


def test_weight_gradient_accumulates():
    layer = embed(bias_term=False)
    x, gy = numpy.array([[1.0, 1.0]]), numpy.ones((1, 2, 3))
    bottom, top = [make_blob(x)], [Blob(dtype=numpy.float64)]
    layer.setup(bottom, top)
    for _ in range(2):  # diffs add up over passes (iter_size, shared weights)
        layer.forward(bottom, top)
        top[0].diff[...] = gy
        layer.backward(top, [False], bottom)
    numpy.testing.assert_allclose(layer.blobs[0].diff[1], [4.0, 4.0, 4.0])
    numpy.testing.assert_allclose(layer.blobs[0].diff[[0, 2, 3, 4]], 0)


def test_embedding_rows_lists_each_used_row_once(xp):
    index = xp.asarray(numpy.array([[3, 0], [3, 3]]))
    gy = xp.asarray(numpy.arange(8.0).reshape(2, 2, 2))
    rows, summed = embedding_rows(index, gy, 5)
    numpy.testing.assert_array_equal(to_numpy(rows), [0, 3])
    numpy.testing.assert_allclose(to_numpy(summed), [[2.0, 3.0], [0 + 4 + 6, 1 + 5 + 7]])


@pytest.mark.parametrize("bias_term", [True, False])
def test_gradient_check(bias_term):
    x = RS.randint(6, size=(3, 4)).astype(float)
    checked = check_gradient(embed(num_output=4, input_dim=6, bias_term=bias_term), [make_blob(x)], [Blob()],
                             check_bottom=[])
    assert checked == 6 * 4 + (4 if bias_term else 0)


def test_matches_torch_embedding():
    torch = pytest.importorskip("torch")
    layer = embed(num_output=4, input_dim=6, bias_term=False)
    x = RS.randint(6, size=(3, 5)).astype(float)
    gy = RS.randn(3, 5, 4)
    y, grads = forward_backward(layer, x, gy, numpy)
    w = torch.tensor(layer.blobs[0].data, requires_grad=True)
    ty = torch.nn.functional.embedding(torch.tensor(x, dtype=torch.long), w)
    (ty * torch.tensor(gy)).sum().backward()
    numpy.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-14)
    numpy.testing.assert_allclose(grads[0], w.grad.numpy(), rtol=1e-12)


def test_no_gradient_into_the_indices():
    layer = embed()
    assert not layer.allow_force_backward(0)
    x = numpy.array([2.0, 0.0])
    bottom, top = [make_blob(x)], [Blob(dtype=numpy.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = 1
    layer.backward(top, [False], bottom)
    numpy.testing.assert_array_equal(bottom[0].diff, 0)


@pytest.mark.parametrize("value,message", [
    (3.0, r"index 3 at position 1 is not an integer in \[0, 3\)"),
    (-1.0, r"index -1 at position 1 is not an integer in \[0, 3\)"),
    (1.5, r"index 1\.5 at position 1 is not an integer in \[0, 3\)")])
def test_bad_index_is_one_line_naming_the_layer(value, message):
    layer = create_layer({"name": "words", "type": "Embed", "embed": {"num_output": 2, "input_dim": 3}})
    bottom, top = [make_blob([[0.0, value]])], [Blob()]
    layer.setup(bottom, top)
    with pytest.raises(DataError, match=r"^layer 'words' \(Embed\): " + message) as err:
        layer.forward(bottom, top)
    assert "\n" not in str(err.value)


def test_caffe_prototxt_converts_and_runs(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text("""name: "embed"
input: "words" input_shape { dim: 2 dim: 3 }
layer { name: "embed" type: "Embed" bottom: "words" top: "e"
  embed_param { num_output: 4 input_dim: 10 bias_term: false weight_filler { type: "gaussian" std: 0.1 } } }
""")
    net = Net(str(path), phase="test")
    words = numpy.array([[1.0, 2, 9], [0, 0, 5]])
    out = net.forward(words=words)
    w = net.params["embed"][0].data
    assert len(net.params["embed"]) == 1 and w.shape == (10, 4)
    numpy.testing.assert_allclose(out["e"], w[words.astype(int)])
