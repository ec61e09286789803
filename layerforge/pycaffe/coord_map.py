"""pycaffe's ``caffe.coord_map``: how spatial coordinates of one NetSpec top relate to another's.

A layer's map is ``(axis, scale, shift)``: output coordinate ``y`` and input coordinate ``x`` are related by
``y * scale + shift = x`` read the other way round, i.e. input position ``x`` lands at ``x * scale`` in the
output after the output is shifted by ``shift``. ``axis`` is the first spatial axis the map applies to
(None for layers that leave coordinates alone); scale and shift are per spatial axis (numpy arrays for
layers with per-axis parameters, scalars otherwise). The main use is :func:`crop`: the Crop layer that
aligns an upsampled score map with the input (FCN).

    conv / pool / im2col   axis, 1 / stride, (pad - (k_eff - 1) / 2) / stride,  k_eff = (k - 1) dilation + 1
    deconv                 axis, stride, (k_eff - 1) / 2 - pad
    crop                   axis - 1, 1, -offset
    pointwise layers       None, 1, 0
"""
import numpy as np

from .net_spec import layers as L

# layers whose every output element sits where its input element did
PASS_THROUGH_LAYERS = ("AbsVal", "BatchNorm", "Bias", "BNLL", "Clip", "Dropout", "Eltwise", "ELU", "Exp", "Log",
                       "LRN", "MVN", "Power", "PReLU", "ReLU", "Scale", "Sigmoid", "Split", "Swish", "TanH",
                       "Threshold")
_WINDOWED = ("Convolution", "Pooling", "Im2col")


class UndefinedMapException(Exception):
    """The layer has no coordinate map (e.g. InnerProduct); the walk does not pass through it."""


class AxisMismatchException(Exception):
    """Two maps that apply to different spatial axes cannot be composed."""


def _vector(value, default):
    return np.array(default if value is None else value, ndmin=1)


def conv_params(fn):
    """``(axis, stride, effective kernel extent, pad)`` of a Convolution / Deconvolution / Im2col / Pooling
    NetSpec function; arrays with one entry per spatial axis (or one for all)."""
    params = fn.params.get("convolution_param", fn.params)
    if fn.type_name == "Pooling":
        params = fn.params.get("pooling_param", params)
    legacy = {"kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w"} & set(params)
    assert not legacy, f"coord_map: {fn.type_name} uses {sorted(legacy)}; give kernel_size/stride/pad instead"
    kernel = _vector(params.get("kernel_size"), None)
    dilation = _vector(params.get("dilation"), 1)
    extent = (kernel - 1) * dilation + 1
    return params.get("axis", 1), _vector(params.get("stride"), 1), extent, _vector(params.get("pad"), 0)


def crop_params(fn):
    """``(axis, offsets)`` of a Crop function, with Crop's default axis 2."""
    params = fn.params.get("crop_param", fn.params)
    return params.get("axis", 2), _vector(params.get("offset"), 0)


def coord_map(fn):
    """The ``(axis, scale, shift)`` map of one NetSpec function; UndefinedMapException where there is none."""
    kind = fn.type_name
    if kind in _WINDOWED:
        axis, stride, extent, pad = conv_params(fn)
        return axis, 1 / stride, (pad - (extent - 1) / 2) / stride
    if kind == "Deconvolution":
        axis, stride, extent, pad = conv_params(fn)
        return axis, stride, (extent - 1) / 2 - pad
    if kind == "Crop":
        axis, offset = crop_params(fn)
        return axis - 1, 1, -offset  # Crop's axis counts the first cropped axis; maps count the one before
    if kind in PASS_THROUGH_LAYERS:
        return None, 1, 0
    raise UndefinedMapException(kind)


def compose(base_map, next_map):
    """The map of ``base_map`` followed by ``next_map``: scales multiply, the second shift is scaled by the
    first scale."""
    axis1, scale1, shift1 = base_map
    axis2, scale2, shift2 = next_map
    if axis1 is not None and axis2 is not None and axis1 != axis2:
        raise AxisMismatchException(f"maps on axes {axis1} and {axis2}")
    return (axis2 if axis1 is None else axis1), scale1 * scale2, scale1 * shift2 + shift1


def inverse(coord_map):
    """The map that undoes ``coord_map``."""
    axis, scale, shift = coord_map
    return axis, 1 / scale, -shift / scale


def _mappable_bottoms(top):
    # Crop's second bottom only gives the output size; coordinates flow from the first
    bottoms = top.fn.inputs
    return bottoms[:1] if top.fn.type_name == "Crop" else bottoms


def _maps_to_ancestors(top, stop_at=None):
    """``{ancestor top: map from ancestor to top}`` for every ancestor reachable through mappable layers.
    With ``stop_at``, returns ``(ancestor, map)`` for the first ancestor found in it instead."""
    maps, frontier = {top: (None, 1, 0)}, [top]
    while frontier:
        current = frontier.pop()
        if stop_at is not None and current in stop_at:
            return current, maps[current]
        try:
            step = coord_map(current.fn)
        except UndefinedMapException:
            continue
        for bottom in _mappable_bottoms(current):
            maps[bottom] = compose(maps[current], step)
            frontier.append(bottom)
    return None if stop_at is not None else maps


def coord_map_from_to(top_from, top_to):
    """The map ``(axis, scale, shift)`` from the coordinates of ``top_from`` to those of ``top_to``, through
    their nearest common ancestor. RuntimeError when no chain of spatial layers connects them."""
    from_maps = _maps_to_ancestors(top_from)
    found = _maps_to_ancestors(top_to, stop_at=from_maps)
    if found is None:
        raise RuntimeError("no coordinate map between these tops: they are not connected by spatial layers "
                           "(Convolution, Pooling, Deconvolution, Crop or pointwise layers)")
    common, to_map = found
    return compose(to_map, inverse(from_maps[common]))


def crop(top_from, top_to):
    """A Crop layer (NetSpec top) that crops ``top_from`` to the extent and alignment of ``top_to``.

    Asserts that the tops have the same scale and that the offset is a non-negative whole number of pixels.
    """
    axis, scale, shift = coord_map_from_to(top_from, top_to)
    assert np.all(scale == 1), f"crop: the tops have different scales ({scale}); crop needs scale 1"
    assert np.all(shift <= 0), f"crop: negative offset ({shift}); top_from is smaller than top_to"
    assert np.all(np.round(shift) == shift), f"crop: offset {shift} is not a whole number of pixels"
    offsets = [int(o) for o in np.atleast_1d(-np.round(shift))]
    return L.Crop(top_from, top_to, crop_param=dict(axis=axis + 1, offset=offsets))
