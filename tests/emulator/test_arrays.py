"""The emulated cupy.ndarray: as strict as cupy at the host boundary, numpy's results everywhere else."""
import pickle

import numpy
import pytest

from tests.emulator.emulated import cupy  # noqa: F401 - the fixture

SHAPE = (3, 4)


def host(shape=SHAPE, dtype=numpy.float32, seed=0):
    return numpy.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_an_array_is_not_a_numpy_array(cupy):
    a = cupy.asarray(host())
    assert not isinstance(a, numpy.ndarray) and type(a).__name__ == "ndarray"
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        numpy.asarray(a)
    with pytest.raises(TypeError, match="Implicit conversion"):
        numpy.array(a)


@pytest.mark.parametrize("operation", [
    lambda cp, a, h: a + h, lambda cp, a, h: h + a, lambda cp, a, h: cp.add(a, h), lambda cp, a, h: cp.maximum(h, a),
    lambda cp, a, h: cp.where(a > 0, h, a), lambda cp, a, h: cp.concatenate([a, h]), lambda cp, a, h: numpy.add(h, a),
    lambda cp, a, h: cp.copyto(a, h), lambda cp, a, h: a.__iadd__(h), lambda cp, a, h: cp.dot(a, h.T)])
def test_a_numpy_operand_is_refused_with_cupys_type_error(cupy, operation):
    a, h = cupy.asarray(host()), host(seed=1)
    with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>|Only cupy arrays"):
        operation(cupy, a, h)


def test_scalars_are_operands_and_host_arrays_are_not_fill_values(cupy):
    a = cupy.asarray(host())
    numpy.testing.assert_array_equal((a * 2.0 + numpy.float32(1)).get(), host() * 2 + 1)
    assert (a + numpy.float64(1)).dtype == numpy.float64 and (a + 1.0).dtype == numpy.float32  # NEP 50, as cupy 14
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        a[...] = host()
    a[...] = numpy.float32(3)
    assert float(a[1, 2]) == 3.0
    # a scatter takes host values, as cupy's (they are copied to the device first)
    a[[0, 2]] = host()[:2]
    a[a > 100] = numpy.zeros(0, numpy.float32)
    numpy.testing.assert_array_equal(a.get()[[0, 2]], host()[:2])


def test_get_asnumpy_and_asarray_are_the_crossings(cupy):
    h = host()
    a = cupy.asarray(h)
    h[0, 0] = 99  # asarray copied: the device array keeps the values of the call
    assert a.get()[0, 0] != 99
    numpy.testing.assert_array_equal(cupy.asnumpy(a), a.get())
    out = numpy.empty(SHAPE, numpy.float32)
    assert a.get(out=out) is out
    b = cupy.empty(SHAPE, numpy.float32)
    b.set(h)
    assert b.get()[0, 0] == 99 and a.item(0) == a.get().item(0) and a.tolist() == a.get().tolist()
    with pytest.raises(TypeError, match="array cannot be set"):
        b.set(h.astype(numpy.float64))


def test_python_conversions_read_the_device(cupy):
    a = cupy.asarray(numpy.array(2.5, numpy.float32))
    assert float(a) == 2.5 and int(a) == 2 and bool(a) and repr(a) == repr(numpy.array(2.5, numpy.float32))
    with pytest.raises(TypeError):
        range(a)  # cupy arrays have no __index__
    with pytest.raises(TypeError):
        float(cupy.ones(2))  # as numpy 2's float() of a host copy
    assert pickle.loads(pickle.dumps(a)).get() == 2.5


def test_views_share_memory(cupy):
    a = cupy.asarray(host((2, 3, 4)))
    views = [a[1], a[:, 1:], a.reshape(6, 4), a.transpose(2, 0, 1), a.T, a[..., ::-1], a.view(numpy.int32),
             a.swapaxes(0, 1), a[None], a.ravel(), cupy.broadcast_to(a[0, 0], (5, 4)), cupy.flip(a, 1)]
    for v in views:
        assert cupy.may_share_memory(a, v) and v.base is a
    a[1, 0, 0] = 7
    assert float(views[0][0, 0]) == 7 and float(views[2][3, 0]) == 7 and float(views[4][0, 0, 1]) == 7
    t = a.T
    assert t.flags.f_contiguous and not t.flags.c_contiguous and t.strides == a.get().T.strides
    assert a[0].data.ptr == a.data.ptr and a[1].data.ptr == a.data.ptr + 12 * 4
    assert not cupy.may_share_memory(a, a.copy()) and a.copy().flags.owndata
    c = t.reshape(-1)  # not expressible as a view: a copy, as numpy's
    assert not cupy.may_share_memory(c, a)
    numpy.testing.assert_array_equal(c.get(), a.get().T.reshape(-1))


def test_metadata(cupy):
    a = cupy.zeros((2, 3), numpy.float64)
    assert (a.shape, a.ndim, a.size, a.itemsize, a.nbytes, a.dtype) == ((2, 3), 2, 6, 8, 48, numpy.float64)
    assert a.device.id == 0 and a.data.device_id == 0 and a.data.ptr % 256 == 0 and len(a) == 2


@pytest.mark.parametrize("key", [1, (slice(None), 2), (Ellipsis, 1), -1, ([0, 2],), (slice(None), [3, 0, 1]),
                                 (numpy.array([1, 0]), slice(1, 3))])
def test_indexing_gives_numpys_elements(cupy, key):
    h = host()
    numpy.testing.assert_array_equal(cupy.asarray(h)[key].get(), h[key])


def test_boolean_and_array_indices(cupy):
    h = host()
    a = cupy.asarray(h)
    numpy.testing.assert_array_equal(a[a > 0].get(), h[h > 0])
    numpy.testing.assert_array_equal(a[cupy.asarray(numpy.array([2, 0]))].get(), h[[2, 0]])
    a[a < 0] = 0
    numpy.testing.assert_array_equal(a.get(), numpy.where(h < 0, 0, h))
    a[:, cupy.asarray(numpy.array([1]))] = -1
    assert (a.get()[:, 1] == -1).all()
    with pytest.raises(IndexError):  # stricter than cupy, which wraps around
        a[cupy.asarray(numpy.array([3]))].get()


def test_in_place_operators_and_out(cupy):
    h = host()
    a = cupy.asarray(h)
    a += 1
    a *= 2
    a -= cupy.asarray(h)
    numpy.testing.assert_allclose(a.get(), (h + 1) * 2 - h, rtol=1e-6)
    out = cupy.empty(SHAPE, numpy.float32)
    assert cupy.multiply(a, 0.5, out=out) is out
    numpy.testing.assert_allclose(out.get(), a.get() * 0.5, rtol=1e-6)
    cupy.add.at(out, (cupy.asarray(numpy.array([0, 0])),), 1.0)
    numpy.testing.assert_allclose(out.get()[0], a.get()[0] * 0.5 + 2, rtol=1e-6)


FUNCTIONS = {  # name -> (cupy call, numpy call) on the same host data
    "sum_axis": (lambda xp, a: xp.sum(a, axis=1, keepdims=True)), "mean": (lambda xp, a: a.mean(axis=0)),
    "var": (lambda xp, a: a.var()), "max": (lambda xp, a: a.max(axis=1)), "argmax": (lambda xp, a: a.argmax(1)),
    "argsort": (lambda xp, a: xp.argsort(a, axis=1)), "exp": (lambda xp, a: xp.exp(a)),
    "log1p_abs": (lambda xp, a: xp.log1p(xp.abs(a))), "tanh": (lambda xp, a: xp.tanh(a)),
    "where": (lambda xp, a: xp.where(a > 0, a, 0.1 * a)), "maximum": (lambda xp, a: xp.maximum(a, 0)),
    "clip": (lambda xp, a: a.clip(-0.5, 0.5)), "astype": (lambda xp, a: a.astype(xp.int32)),
    "concatenate": (lambda xp, a: xp.concatenate([a, a * 2], axis=1)), "cumsum": (lambda xp, a: a.cumsum(0)),
    "take": (lambda xp, a: xp.take(a, xp.arange(2), axis=1)), "flip": (lambda xp, a: xp.flip(a, 0) + 0),
    "take_along_axis": (lambda xp, a: xp.take_along_axis(a, xp.argsort(a, axis=1), 1)),
    "sign_trunc_floor": (lambda xp, a: xp.sign(a) * xp.trunc(a * 3) + xp.floor(a)),
    "power_sqrt": (lambda xp, a: xp.sqrt(xp.power(a, 2))), "reciprocal": (lambda xp, a: xp.reciprocal(a)),
    "expm1_log": (lambda xp, a: xp.expm1(a) + xp.log(a * a + 1)), "minimum": (lambda xp, a: xp.minimum(a, -a)),
    "matmul": (lambda xp, a: a @ a.T), "nonzero": (lambda xp, a: xp.nonzero(a > 0)[1]),
    "flatnonzero": (lambda xp, a: xp.flatnonzero(a > 0)), "unique": (lambda xp, a: xp.unique((a > 0).astype(int))),
    "bincount": (lambda xp, a: xp.bincount((a > 0).ravel().astype(xp.int64), minlength=3)),
    "full_like": (lambda xp, a: xp.full_like(a, 7) + xp.ones_like(a) + xp.zeros_like(a)),
    "ascontiguousarray": (lambda xp, a: xp.ascontiguousarray(a.T)), "any_all": (lambda xp, a: (a > 0).any(1)),
    "subtract_multiply": (lambda xp, a: xp.subtract(xp.multiply(a, 2), 1)), "std": (lambda xp, a: a.std(1)),
    "prod_min": (lambda xp, a: a.prod(0) + a.min(0)), "squeeze": (lambda xp, a: a[:1].squeeze(0) * 1),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_results_are_numpys(cupy, name):
    fn, h = FUNCTIONS[name], host()
    got, want = fn(cupy, cupy.asarray(h)), fn(numpy, h)
    assert isinstance(got, cupy.ndarray)
    assert got.dtype == numpy.asarray(want).dtype and got.shape == numpy.shape(want)
    numpy.testing.assert_allclose(got.get(), want, rtol=1e-6, atol=1e-7)


def test_numpy_functions_on_device_arrays_run_cupys(cupy):
    a = cupy.asarray(host())
    for value in (numpy.sum(a, axis=0), numpy.maximum(a, 0), numpy.concatenate([a, a]), numpy.exp(a)):
        assert isinstance(value, cupy.ndarray)


def test_reductions_with_out_and_zero_d_results(cupy):
    a = cupy.asarray(host())
    total = a.sum()
    assert isinstance(total, cupy.ndarray) and total.shape == () and float(total) == pytest.approx(host().sum(), 1e-5)
    out = cupy.empty(4, numpy.float32)
    assert cupy.sum(a, axis=0, out=out) is out
    numpy.testing.assert_allclose(out.get(), host().sum(0), rtol=1e-6)


def test_creation(cupy):
    assert cupy.arange(5).get().tolist() == list(range(5)) and cupy.arange(5).dtype == numpy.arange(5).dtype
    assert (cupy.full((2, 2), 3.5, numpy.float32).get() == 3.5).all()
    numpy.testing.assert_array_equal(cupy.ones((2,), cupy.uint8).get(), [1, 1])
    empty = cupy.empty((2, 3), numpy.float32)
    assert numpy.isnan(empty.get()).all()  # fresh device memory is poisoned: reading it before writing shows


def test_fill_sort_copy_and_astype(cupy):
    h = host()
    a = cupy.asarray(h)
    b = a.copy()
    b.sort(axis=1)
    numpy.testing.assert_array_equal(b.get(), numpy.sort(h, 1))
    assert a.astype(numpy.float32, copy=False) is a
    b.fill(2)
    assert (b.get() == 2).all() and (a.get() == h).all()


def test_an_array_of_another_device_is_refused(cupy):
    a = cupy.ones(3)
    with cupy.cuda.Device(1):
        with pytest.raises(ValueError, match=r"resides \(0\) is different from the current device \(1\)"):
            a + 1
        b = cupy.ones(3)
    assert b.device.id == 1 and a.device.id == 0
