"""Test helpers: Caffe's GradientChecker (central differences) and blob construction.

``check_gradient(layer, bottom, top)`` sets the layer up, defines the objective
``L = sum_i <top_i.data, R_i>`` with fixed random R_i, and compares the analytic gradient that
``backward`` produces for every bottom element and parameter element with
``(L(x + h) - L(x - h)) / 2h``. A pair fails when
``|analytic - numeric| > threshold * max(|analytic|, |numeric|, 1)``. Elements within
``kink_range`` of ``kink`` (e.g. ReLU at 0) are skipped, as Caffe does.
"""
import numpy

from . import rng
from .backend import get_array_module, to_numpy
from .blob import Blob


def make_blob(array, dtype=numpy.float64, xp=numpy):
    """A Blob holding a copy of ``array`` (on ``xp``'s device)."""
    array = numpy.asarray(array, dtype=dtype)
    b = Blob(array.shape, dtype, xp)
    b.data[...] = xp.asarray(array)
    return b


def run_layer(layer, x, gy, xp=numpy, in_place=False):
    """Set up a one-bottom, one-top layer on ``x``, run forward, then backward from top diff ``gy``.

    Returns:
        ``(y, gx, param_diffs)`` as numpy copies; with ``in_place`` the top is the bottom blob.
    """
    bottom = make_blob(x, xp=xp)
    top = bottom if in_place else Blob((), numpy.float64, xp)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    y = to_numpy(top.data).copy()
    top.diff[...] = xp.asarray(gy)
    layer.backward([top], [True], [bottom])
    return y, to_numpy(bottom.diff).copy(), [to_numpy(p.diff).copy() for p in layer.blobs]


def check_gradient(layer, bottom, top, check_bottom=None, check_params=True, stepsize=1e-3, threshold=1e-3,
                   kink=0.0, kink_range=-1.0, max_checks=None, seed=1701):
    """Raise AssertionError naming the blob and element whose gradient is off.

    Args:
        layer: an un-set-up Layer, ideally created with dtype float64.
        bottom, top: lists of Blobs (tops may be empty Blobs; setup shapes them).
        check_bottom: indices of bottoms to check (default all); others get ``propagate_down=False``.
        check_params: also check ``layer.blobs``.
        stepsize, threshold: Caffe's names; the comparison is scaled by max(|a|, |n|, 1).
        kink, kink_range: skip elements whose input value lies within kink_range of kink.
        max_checks: check at most this many elements per blob (a seeded random subset).
    Returns:
        The number of elements checked.
    """
    for t in top:  # a float32 top would silently make the check a float32 one
        t.cast(layer.dtype)
    layer.setup(bottom, top)
    checks = list(range(len(bottom))) if check_bottom is None else list(check_bottom)
    propagate_down = [i in checks for i in range(len(bottom))]
    state = rng.get_state()
    weights_rng = numpy.random.default_rng(seed)
    R = None

    def objective():
        nonlocal R
        rng.set_state(state)
        layer.reshape(bottom, top)
        layer.forward(bottom, top)
        if R is None:
            R = [weights_rng.standard_normal(t.shape) for t in top]
        return float(sum(numpy.sum(to_numpy(t.data).astype(numpy.float64) * r) for t, r in zip(top, R)))

    objective()
    for t, r in zip(top, R):
        t.diff[...] = get_array_module(t.diff).asarray(r)
    for b in bottom:
        b.diff[...] = 0
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward(top, propagate_down, bottom)
    targets = [(f"bottom[{i}]", bottom[i]) for i in checks]
    if check_params:
        targets += [(f"param[{j}]", p) for j, p in enumerate(layer.blobs)]
    analytic = [to_numpy(blob.diff).astype(numpy.float64) for _, blob in targets]
    pick = numpy.random.default_rng(seed + 1)
    checked = 0
    for (label, blob), grad in zip(targets, analytic):
        flat = blob.data.reshape(-1)
        indices = numpy.arange(flat.size)
        if max_checks is not None and flat.size > max_checks:
            indices = pick.choice(flat.size, max_checks, replace=False)
        for k in indices:
            x = float(flat[k])
            if kink_range > 0 and abs(x - kink) < kink_range:
                continue
            flat[k] = x + stepsize
            plus = objective()
            flat[k] = x - stepsize
            minus = objective()
            flat[k] = x
            numeric = (plus - minus) / (2 * stepsize)
            a = float(grad.reshape(-1)[k])
            scale = max(abs(a), abs(numeric), 1.0)
            if abs(a - numeric) > threshold * scale:
                raise AssertionError(f"{layer.type} '{layer.name}' {label} element {numpy.unravel_index(k, blob.shape)}: "
                                     f"analytic {a:.6g} vs numeric {numeric:.6g}")
            checked += 1
    objective()
    return checked
