"""pycaffe's ``caffe.Net``: a view of :class:`layerforge.Net` with pycaffe's names and call conventions.

Where the two APIs differ, ``layerforge.Net`` keeps its documented behaviour and this view adapts:
``forward(start, end)`` returns the end layer's tops (layerforge returns the net outputs), ``backward``
counts ``start``/``end`` from the top of the net down, ``top_names``/``bottom_names`` are ordered
dicts, phases are pycaffe's ``TRAIN = 0``/``TEST = 1`` (``str(caffe.TEST) == 'TEST'``), and a model file may be YAML or prototxt.
"""
import collections
import contextlib
import warnings

import numpy

from ..errors import LayerforgeError
from ..layers.python_layer import TEST, TRAIN  # 0 and 1, whose str() is their name (Caffe's enum)
from ..net import Net as _Net
from . import mode
from .blob import BlobView, LayerView, after_sync, on_device, synced, views

_PHASES = {TRAIN: "train", TEST: "test", "train": "train", "test": "test", "TRAIN": "train", "TEST": "test"}


@contextlib.contextmanager
def user_exceptions():
    """Let an exception raised by a Python layer's own code through as itself, as pycaffe does (layerforge
    turns it into a one-line error naming the layer)."""
    try:
        yield
    except LayerforgeError as e:
        user = getattr(e, "user_exception", None)
        if user is None:
            raise
        raise user from e


def phase_name(phase):
    """pycaffe's ``caffe.TRAIN``/``caffe.TEST`` (or a name) -> layerforge's ``"train"``/``"test"``."""
    if phase not in _PHASES:
        raise LayerforgeError(f"phase must be caffe.TRAIN or caffe.TEST, got {phase!r}")
    return _PHASES[phase]


def _as_layer_callback(fn):
    """A callable of the layer index: ``fn`` itself, or the ``run`` of a Caffe Net::Callback object (caffe.NCCL)."""
    return fn if callable(fn) else fn.run


class Net:
    """``caffe.Net(model, phase, level=0, stages=None, weights=None)`` or the legacy ``(model, weights, phase)``.

    ``model`` is a prototxt or YAML net file; ``weights`` a .caffemodel or .npz. The layerforge Net is
    ``self.net`` (a view: both see the same blobs and parameters).
    """

    def __init__(self, model, *args, level=0, stages=None, weights=None, _net=None):
        if _net is not None:
            self.net = _net
            return
        if len(args) == 2:  # Caffe's legacy Net(model, weights, phase)
            warnings.warn("Net(model, weights, phase) is deprecated: use Net(model, phase, weights=weights)",
                          DeprecationWarning, stacklevel=2)
            weights, phase = args
        elif len(args) == 1:
            phase = args[0]
        else:
            raise TypeError("Net(model, phase, level=0, stages=None, weights=None) takes a model and a phase")
        with user_exceptions():
            self.net = _Net(model, phase=phase_name(phase), level=level, stages=tuple(stages or ()),
                            xp=mode.array_module())
        self._input_shapes = self._shapes_of_inputs()
        if weights is not None:
            self.copy_from(weights)

    # -- the graph -------------------------------------------------------------------------------
    @property
    def blobs(self):
        """OrderedDict {blob name: Blob}, inputs to outputs (Split layers' blobs included, as in Caffe); on a GPU,
        views whose ``data`` and ``diff`` are host copies (pycaffe/blob.py)."""
        if on_device(self.net):
            return collections.OrderedDict((n, BlobView(b)) for n, b in self.net.blobs.items())
        return self.net.blobs

    @property
    def params(self):
        """OrderedDict {layer name: [Blob, ...]} of layers with parameters (weights, then bias)."""
        wrap = views if on_device(self.net) else list
        return collections.OrderedDict((n, wrap(b)) for n, b in self.net.params.items())

    @property
    def layers(self):
        return [self._shown(layer) for layer in self.net.layers]

    def _shown(self, layer):
        """A layer as pycaffe gives it: a Python layer is the user's own object, as in Caffe (py-faster-rcnn's
        train.py calls ``solver.net.layers[0].set_roidb(roidb)``); on a device the others are views."""
        if layer.type == "Python":
            return layer.impl
        return LayerView(layer) if on_device(self.net) else layer

    @property
    def _layer_names(self):
        return [layer.name for layer in self.net.layers]

    # Caffe's C++ accessors, which pycaffe's Python properties are made of (and scripts use directly)
    @property
    def _blob_names(self):
        return list(self.net.blobs)

    @property
    def _blobs(self):
        return list(self.blobs.values())

    @property
    def _blob_loss_weights(self):
        return list(self.blob_loss_weights.values())

    @property
    def _inputs(self):
        """Indices into ``_blobs`` of the net inputs."""
        return [self._blob_names.index(name) for name in self.net.inputs]

    @property
    def _outputs(self):
        return [self._blob_names.index(name) for name in self.net.outputs]

    def _bottom_ids(self, i):
        """Indices into ``_blobs`` of layer ``i``'s bottoms."""
        names = self._blob_names
        return [names.index(name) for name in self.net.bottom_names(i)]

    def _top_ids(self, i):
        names = self._blob_names
        return [names.index(name) for name in self.net.top_names(i)]

    @synced
    def _forward(self, start, end):
        """Layers ``start``..``end`` (indices, inclusive) forward; returns their loss (Caffe's ForwardFromTo)."""
        with user_exceptions():
            self.net.forward(start=int(start), end=int(end))
        return self.net.loss

    @synced
    def _backward(self, start, end):
        """Layers ``start`` down to ``end`` (indices, start >= end) backward (Caffe's BackwardFromTo)."""
        with user_exceptions():
            self.net.backward(start=int(end), end=int(start))

    # Caffe's Net callbacks: fn(layer index) around each layer's forward and backward step
    def before_forward(self, fn):
        self.net.add_hooks(before_forward=after_sync(_as_layer_callback(fn)))

    def after_forward(self, fn):
        self.net.add_hooks(after_forward=after_sync(_as_layer_callback(fn)))

    def before_backward(self, fn):
        self.net.add_hooks(before_backward=after_sync(_as_layer_callback(fn)))

    def after_backward(self, fn):
        """``fn(layer index)`` after each layer's step of backward, or a caffe.NCCL (its layer-wise exchange)."""
        self.net.add_hooks(after_backward=after_sync(_as_layer_callback(fn)))

    @property
    def layer_dict(self):
        return collections.OrderedDict((n, self._shown(layer)) for n, layer in self.net.layer_dict.items())

    @property
    def inputs(self):
        return list(self.net.inputs)

    @property
    def outputs(self):
        return list(self.net.outputs)

    @property
    def top_names(self):
        return collections.OrderedDict((layer.name, self.net.top_names(i)) for i, layer in enumerate(self.net.layers))

    @property
    def bottom_names(self):
        return collections.OrderedDict((layer.name, self.net.bottom_names(i))
                                       for i, layer in enumerate(self.net.layers))

    @property
    def blob_loss_weights(self):
        """OrderedDict {blob name: loss weight} (0 for blobs that are not losses)."""
        weights = collections.OrderedDict((name, 0.0) for name in self.net.blobs)
        for i in range(len(self.net.layers)):
            for name, w in zip(self.net.top_names(i), self.net.loss_weights(i)):
                weights[name] = float(w)
        return weights

    # -- passes ----------------------------------------------------------------------------------
    @synced
    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """Run layers ``start``..``end`` (names, inclusive) after copying input arrays ``kwargs``.

        Returns {blob name: data} of the end layer's tops (the net outputs without ``end``) and ``blobs``.
        """
        self._put(kwargs, self.inputs, "data")
        if self._shapes_of_inputs() != getattr(self, "_input_shapes", None):
            self.reshape()  # an input blob was reshaped: Caffe reshapes every layer before its forward
        with user_exceptions():
            self.net.forward(start=start, end=end)
        names = (self.top_names[end] if end is not None else self.outputs) + list(blobs or [])
        shown = self.blobs
        return {name: shown[name].data for name in names}

    @synced
    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """Back-propagate from layer ``start`` down to ``end`` (names, inclusive) after copying output diffs.

        Returns {blob name: diff} of the end layer's bottoms (the net inputs without ``end``) and ``diffs``.
        """
        self._put(kwargs, self.outputs, "diff")
        with user_exceptions():
            self.net.backward(start=end, end=start)  # layerforge's range runs bottom-up; backward walks it down
        names = (self.bottom_names[end] if end is not None else self.inputs) + list(diffs or [])
        shown = self.blobs
        return {name: shown[name].diff for name in names}

    def _put(self, arrays, names, field):
        """Copy ``arrays`` into the ``field`` ("data"/"diff") of blobs ``names``: all of them, batch-sized."""
        if not arrays:
            return
        if set(arrays) != set(names):
            raise LayerforgeError(f"{field} arguments {sorted(arrays)} do not match the blobs {sorted(names)}")
        for name, array in arrays.items():
            blob = self.net.blobs[name]
            if array.shape[0] != blob.shape[0]:
                raise LayerforgeError(f"'{name}' is given {array.shape[0]} items; the batch size is {blob.shape[0]}")
            target = getattr(blob, field)
            target[...] = self.net.xp.asarray(array)  # a host array, copied to the device where the blob lives

    def forward_all(self, blobs=None, **kwargs):
        """Forward over inputs of any length, in batches (the last one zero-padded); outputs cut to length."""
        outs = {name: [] for name in set(self.outputs + list(blobs or []))}
        for batch in self._batch(kwargs):
            for name, data in self.forward(blobs=blobs, **batch).items():
                outs[name].extend(data.copy())
        return self._unpad(outs, kwargs)

    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        """Forward and backward in batches: ``(outputs, input diffs)`` as dicts of arrays."""
        import itertools

        outs = {name: [] for name in set(self.outputs + list(blobs or []))}
        grads = {name: [] for name in set(self.inputs + list(diffs or []))}
        forward = self._batch({k: v for k, v in kwargs.items() if k in self.inputs})
        backward = self._batch({k: v for k, v in kwargs.items() if k in self.outputs})
        for fb, bb in itertools.zip_longest(forward, backward, fillvalue={}):
            for name, data in self.forward(blobs=blobs, **fb).items():
                outs[name].extend(data.copy())
            for name, diff in self.backward(diffs=diffs, **bb).items():
                grads[name].extend(diff.copy())
        return self._unpad(outs, kwargs), self._unpad(grads, kwargs)

    def _batch(self, arrays):
        if not arrays:
            return
        n = len(next(iter(arrays.values())))
        batch = next(iter(self.net.blobs.values())).shape[0]
        for i in range(0, n - n % batch, batch):
            yield {name: a[i:i + batch] for name, a in arrays.items()}
        if n % batch:
            yield {name: numpy.concatenate([a[n - n % batch:], numpy.zeros((batch - n % batch,) + a.shape[1:], a.dtype)])
                   for name, a in arrays.items()}

    @staticmethod
    def _unpad(collected, given):
        out = {name: numpy.asarray(v) for name, v in collected.items()}
        if given:
            n = len(next(iter(given.values())))
            out = {name: v[:n] for name, v in out.items()}
        return out

    @synced
    def reshape(self):
        """Propagate changed input blob shapes through every layer (Caffe's Net::Reshape)."""
        with user_exceptions():
            self.net.reshape()
        self._input_shapes = self._shapes_of_inputs()

    def _shapes_of_inputs(self):
        return [self.net.blobs[name].shape for name in self.net.inputs]

    @synced
    def clear_param_diffs(self):
        self.net.clear_param_diffs()

    # -- weights ---------------------------------------------------------------------------------
    @synced
    def copy_from(self, weights):
        """Copy weights by layer name from a .caffemodel, Caffe HDF5 or .npz file, whatever its name
        (layers absent from the file keep theirs)."""
        from ..caffe.caffemodel import copy_from_hdf5, copy_trained_layers

        with open(weights, "rb") as f:
            magic = f.read(8)
        if magic.startswith(b"PK\x03\x04"):  # a zip: layerforge's .npz
            self.net.copy_from(weights)
        elif magic.startswith(b"\x89HDF"):
            copy_from_hdf5(self.net, weights)
        else:
            copy_trained_layers(self.net, weights)

    @synced
    def share_with(self, other):
        """Use ``other``'s parameter blobs (same storage) for every layer of the same name (Caffe's ShareTrainedLayersWith)."""
        self.net.share_params_with(other.net if isinstance(other, Net) else other)

    @synced
    def save(self, path):
        """Write the weights as a .caffemodel (Caffe's NetParameter with each layer's blobs)."""
        from ..caffe.caffemodel import save_caffemodel

        save_caffemodel(self.net, path)

    @synced
    def save_hdf5(self, path):
        """Write the weights in Caffe's HDF5 layout (``/data/<layer>/<i>``)."""
        from ..caffe.caffemodel import save_hdf5

        save_hdf5(self.net, path)

    @synced
    def load_hdf5(self, path):
        """Read weights written by :meth:`save_hdf5` (or Caffe's Net::ToHDF5)."""
        from ..caffe.caffemodel import copy_from_hdf5

        copy_from_hdf5(self.net, path)

    def set_input_arrays(self, data, labels):
        """Hand arrays to the net's MemoryData layer (Caffe's Reset): data (N, C, H, W), labels (N,)."""
        labels = numpy.asarray(labels)
        self._set_input_arrays(numpy.ascontiguousarray(data, numpy.float32),
                               numpy.ascontiguousarray(labels.reshape(len(labels)), numpy.float32))

    @synced
    def _set_input_arrays(self, data, labels):
        layers = [layer for layer in self.net.layers if layer.type == "MemoryData"]
        if not layers:
            raise LayerforgeError("set_input_arrays needs a MemoryData layer; this net has none")
        layers[0].reset(data, numpy.asarray(labels).reshape(len(labels)))

    def __repr__(self):
        return f"<caffe.Net view of {self.net!r}>"
