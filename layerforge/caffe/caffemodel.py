"""Caffe's weights files: ``.caffemodel`` (a NetParameter whose layers carry blobs) and ``.caffemodel.h5``.

Reading follows Caffe's Net::CopyTrainedLayersFrom: source layers are matched to the net's layers by
name, a source layer the net lacks is skipped (logged), and a matched layer must have as many blobs as
the net's, each of the net's shape, or with a legacy 4-d num/channels/height/width equal to the net's
shape padded with leading 1s (Caffe's Blob::ShapeEquals). The V2 ``layer`` and the V1 ``layers`` field
(and V0 layers within those) are read. Writing follows Net::ToProto(write_diff=false): every layer
(splits included) with name, type, bottom, top, phase and its parameter blobs (``shape`` + packed
``data``; ``double_data`` for a float64 net).

The HDF5 flavour is Net::ToHDF5's layout: a group ``/data/<layer>`` per layer holding datasets ``0``,
``1``, ... for the parameters the layer owns (a shared parameter is stored once, by its owner).
"""
import collections
import logging
import os

import numpy
from google.protobuf.message import DecodeError

from .. import backend
from ..errors import LayerforgeError
from ..npz import write_atomic
from . import caffe_pb
from .hdf5 import members, stored

log = logging.getLogger("layerforge")
_LEGACY = ("num", "channels", "height", "width")


def read_message(path, cls, what):
    """Parse the binary protobuf file ``path`` as ``cls``; one-line LayerforgeError naming the path otherwise."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise LayerforgeError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    message = cls()
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise LayerforgeError(f"{path}: not a {what} (binary caffe.{cls.DESCRIPTOR.name}; truncated or corrupt? "
                              f"{e})") from None
    return message


def write_message(path, message):
    """Write ``message`` in binary protobuf format to ``path`` atomically."""
    data = message.SerializeToString()
    write_atomic(path, lambda f: f.write(data))


def _is_legacy(proto):
    return any(proto.HasField(k) for k in _LEGACY)


def blob_shape(proto):
    """The shape a BlobProto declares: ``shape.dim``, or the legacy (num, channels, height, width)."""
    if _is_legacy(proto):
        return tuple(getattr(proto, k) for k in _LEGACY)
    return tuple(proto.shape.dim)


def blob_to_array(proto, where="blob"):
    """The values of a BlobProto as a numpy array of its shape (float64 from ``double_data``, else float32)."""
    shape = blob_shape(proto)
    values = numpy.array(proto.double_data, numpy.float64) if len(proto.double_data) else \
        numpy.array(proto.data, numpy.float32)
    count = int(numpy.prod(shape, dtype=numpy.int64))
    if values.size != count:
        raise LayerforgeError(f"{where}: holds {values.size} values for shape {shape} ({count}); truncated or corrupt?")
    return values.reshape(shape)


def array_to_blob(array, proto=None, legacy=False):
    """Fill a BlobProto (a new one unless given) from ``array``: float64 into ``double_data``, else ``data``.

    ``legacy=True`` writes a 4-d shape as num/channels/height/width, as Caffe's older tools
    (compute_image_mean) do, instead of ``shape``.
    """
    array = numpy.asarray(array)
    proto = caffe_pb.BlobProto() if proto is None else proto
    proto.Clear()
    if legacy:
        if array.ndim > 4:
            raise LayerforgeError(f"a legacy blob has at most 4 axes, got shape {array.shape}")
        for key, n in zip(_LEGACY, (1,) * (4 - array.ndim) + array.shape):
            setattr(proto, key, n)
    else:
        proto.shape.dim.extend(array.shape)
    if array.dtype == numpy.float64:
        proto.MergeFromString(_packed(8, array.astype("<f8", copy=False)))  # double_data = 8
    else:
        proto.MergeFromString(_packed(5, array.astype("<f4", copy=False)))  # data = 5
    return proto


def _packed(number, array):
    """The wire bytes of a packed repeated field ``number`` holding ``array`` (little-endian, as protobuf writes
    floats): merged into a message, they set the values with no Python float made per value (AlexNet's 61 M took
    seconds through ``extend``)."""
    raw = array.tobytes()
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


def _varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def shape_matches(proto, shape):
    """Caffe's Blob::ShapeEquals: legacy 4-d fields match the shape padded to 4 axes with leading 1s."""
    if _is_legacy(proto):
        return len(shape) <= 4 and blob_shape(proto) == (1,) * (4 - len(shape)) + tuple(shape)
    return tuple(proto.shape.dim) == tuple(shape)


def read_caffemodel(path):
    """``{layer name: [BlobProto, ...]}`` of a .caffemodel, in file order (V2 ``layer``, then V1 ``layers``, whose
    entries may wrap a V0 ``layer``)."""
    param = read_message(path, caffe_pb.NetParameter, "Caffe weights file (.caffemodel)")
    if not param.layer and not param.layers:
        raise LayerforgeError(f"{path}: not a Caffe weights file (.caffemodel): it holds no layers")
    layers = collections.OrderedDict()
    for lp in list(param.layer) + list(param.layers):
        if not lp.name and lp.HasField("layer"):  # a V0 net: each V1 entry wraps the V0 layer
            lp = lp.layer
        layers[lp.name] = list(lp.blobs)
    return layers


def caffemodel_arrays(path):
    """``{"<layer>/<index>": array}`` of every blob in a .caffemodel, shapes as stored (layerforge's .npz keys)."""
    return {f"{name}/{j}": blob_to_array(b, f"{path}: layer '{name}' blob {j}")
            for name, blobs in read_caffemodel(path).items() for j, b in enumerate(blobs)}


def hdf5_arrays(path):
    """``{"<layer>/<index>": array}`` of every dataset under /data of a .caffemodel.h5."""
    import h5py
    try:
        with h5py.File(path, "r") as h5:
            if "data" not in h5:
                raise LayerforgeError(f"{path}: not a Caffe HDF5 weights file: no group /data")
            return {f"{name}/{j}": ds[()] for name, group in members(stored(h5, "data", path), path)
                    for j, ds in members(group, path)}
    except OSError as e:
        raise LayerforgeError(f"{path}: not a readable HDF5 weights file: {e}") from None


def is_caffe_weights(path):
    """Whether ``path`` names a Caffe weights file (by extension): .caffemodel, or HDF5 .h5 / .hdf5."""
    return str(path).endswith((".caffemodel", ".h5", ".hdf5"))


def copy_trained_layers(net, path):
    """Copy a .caffemodel's (or .caffemodel.h5's) weights into ``net`` with Caffe's copy semantics.

    Returns the names of the net's layers that took weights from the file (Caffe skips the file's others;
    layers without parameters take none).
    """
    path = os.fspath(path)
    if path.endswith((".h5", ".hdf5")):
        return copy_from_hdf5(net, path)
    targets, copied = net.layer_dict, []
    for name, blobs in read_caffemodel(path).items():
        layer = targets.get(name)
        if layer is None:
            log.info("Ignoring source layer %s", name)
            continue
        if len(blobs) != len(layer.blobs):
            raise LayerforgeError(f"{path}: layer '{name}' has {len(blobs)} blob(s) in the file but "
                                  f"{len(layer.blobs)} in the net")
        for j, (proto, blob) in enumerate(zip(blobs, layer.blobs)):
            if not shape_matches(proto, blob.shape):
                raise LayerforgeError(f"{path}: layer '{name}' blob {j} has shape {blob_shape(proto)} in the file "
                                      f"but {tuple(blob.shape)} in the net")
            values = blob_to_array(proto, f"{path}: layer '{name}' blob {j}").reshape(blob.shape)
            blob.data[...] = net.xp.asarray(values, dtype=net.dtype)
        if blobs:
            copied.append(name)
    return copied


def net_to_proto(net):
    """A NetParameter as Caffe's Net::ToProto(false) writes it: each layer's name, type, bottom, top, phase, blobs."""
    param = caffe_pb.NetParameter(name=net.name)
    for i, layer in enumerate(net.layers):
        lp = param.layer.add(name=layer.name, type=layer.type, phase=caffe_pb.Phase.Value(net.phase))
        lp.bottom.extend(net.bottom_names(i))
        lp.top.extend(net.top_names(i))
        for blob in layer.blobs:
            array_to_blob(backend.to_numpy(blob.data), lp.blobs.add())
    return param


def save_caffemodel(net, path):
    """Write ``net``'s weights as a .caffemodel (atomically)."""
    write_message(path, net_to_proto(net))


def _owned_blobs(net):
    """Per layer, ``[(index, blob)]`` of the parameters it owns (the first layer holding a shared blob)."""
    seen, out = set(), []
    for layer in net.layers:
        row = [(j, b) for j, b in enumerate(layer.blobs) if id(b) not in seen]
        seen.update(id(b) for b in layer.blobs)
        out.append(row)
    return out


def save_hdf5(net, path):
    """Write ``net``'s weights in Caffe's Net::ToHDF5 layout (``/data/<layer>/<i>``), atomically."""
    import h5py

    def write(f):
        with h5py.File(f, "w") as h5:
            data = h5.create_group("data")
            for layer, owned in zip(net.layers, _owned_blobs(net)):
                group = data.require_group(layer.name)
                for j, blob in owned:
                    group.create_dataset(str(j), data=backend.to_numpy(blob.data))
    write_atomic(path, write)


def copy_from_hdf5(net, path):
    """Copy the weights of a Caffe HDF5 weights file (``/data/<layer>/<i>``) into ``net`` by layer name.

    Returns the names of the net's layers that took weights from the file (layers without parameters take none).
    """
    import h5py
    try:
        h5 = h5py.File(path, "r")
    except OSError as e:
        raise LayerforgeError(f"{path}: not a readable HDF5 weights file: {e}") from None
    with h5:
        if "data" not in h5:
            raise LayerforgeError(f"{path}: not a Caffe HDF5 weights file: no group /data")
        data, copied = stored(h5, "data", path), []
        for layer, owned in zip(net.layers, _owned_blobs(net)):
            group = stored(data, layer.name, path)
            if group is None:
                log.info("Ignoring source layer %s", layer.name)
                continue
            if len(group) > len(layer.blobs):
                raise LayerforgeError(f"{path}: layer '{layer.name}' has {len(group)} blob(s) in the file but "
                                      f"{len(layer.blobs)} in the net")
            for j, blob in owned:
                stored_blob = stored(group, str(j), path)
                if stored_blob is None:
                    raise LayerforgeError(f"{path}: layer '{layer.name}' has no blob {j} in the file")
                values = stored_blob[()]
                if tuple(values.shape) != tuple(blob.shape):
                    raise LayerforgeError(f"{path}: layer '{layer.name}' blob {j} has shape {tuple(values.shape)} "
                                          f"in the file but {tuple(blob.shape)} in the net")
                blob.data[...] = net.xp.asarray(values, dtype=net.dtype)
            if owned:
                copied.append(layer.name)
    return copied
