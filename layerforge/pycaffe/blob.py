"""pycaffe's blobs on a GPU: ``data`` and ``diff`` are numpy arrays, as Caffe's are, whichever device computes.

In Caffe a blob's memory is a SyncedMemory: pycaffe's ``blob.data`` is a numpy array over the host copy, and
reading it there (``mutable_cpu_data``) makes the host copy the newest, so the next GPU pass copies it to the device
first. Scripts rely on it: ``net.blobs['data'].data[...] = image`` then ``net.forward()``, ``net.params['conv1'][0]
.data[...] = w``, ``out['prob'][0].argmax()``. After ``caffe.set_mode_gpu()`` layerforge's blobs hold cupy arrays, which
refuse numpy operands and have no implicit host view, so pycaffe hands out views that keep Caffe's rule:

- :class:`BlobView` (a blob's pycaffe face): reading ``data`` / ``diff`` of a device blob gives its host copy, one
  numpy buffer for the array's life (blobs sharing an array share it), filled with the device's values when read
  after device work;
- :func:`sync` writes the host copies read since the last call back into their device arrays; pycaffe calls it
  before anything that computes on the device (``forward``, ``backward``, ``step``, saving, copying weights, ...) and
  after a user's callback in the middle of a pass. As in Caffe, an array kept from before a pass shows the new
  values once its blob is read again (the buffer is refilled in place), not before. Work done through the layerforge
  objects underneath (``net.net``, ``solver.solver``) does not sync.

On numpy the views are not made at all: pycaffe's nets and layers hand out layerforge's own blobs, whose arrays are
host arrays already.
"""
import functools
import weakref

import numpy

from ..backend import get_array_module


class _HostCopy:
    """The host side of one device array, as Caffe's SyncedMemory has it: one numpy buffer, filled from the device
    when pycaffe hands it out after device work, written back before the next. Between the two the buffer is held
    here (what was written into a temporary, ``blob.data[...] = x``, must reach the device); after, only weakly (a
    buffer no one holds is made anew when read again)."""

    def __init__(self, device):
        self.device, self.dirty = device, None  # dirty: the buffer, while it may hold values the device lacks
        self._buffer = lambda: None

    def read(self):
        if self.dirty is not None:
            return self.dirty
        buffer = self._buffer()
        if buffer is None:
            buffer = self.device.get()
            self._buffer = weakref.ref(buffer)
        else:  # the device may have changed it since: Caffe's cpu_data() copies it in place
            self.device.get(out=buffer)
        self.dirty = buffer
        return buffer

    def write_back(self):
        """Copy the buffer to the device if it was read since the last call; False when no one holds it any more."""
        if self.dirty is not None:
            self.device[...] = get_array_module(self.device).asarray(self.dirty)
            self.dirty = None
        return self._buffer() is not None


# device memory (address, shape, strides, dtype) -> its _HostCopy: blobs that share an array (shared parameters,
# in-place layers) share its host copy, as Caffe's blobs share one SyncedMemory
_host_copies = {}


def host(blob, field):
    """``blob.<field>`` ("data" or "diff") as a numpy array: the array itself on numpy, else the host copy of the
    device array, with the device's values (see the module docstring)."""
    array = getattr(blob, field)
    if isinstance(array, numpy.ndarray):
        return array
    key = (array.data.ptr, array.shape, array.strides, array.dtype.str)
    copy = _host_copies.get(key)
    if copy is None:
        copy = _host_copies[key] = _HostCopy(array)
    return copy.read()


def sync():
    """Copy the host copies handed out since the last call back to their device arrays; forget the ones no one
    holds."""
    for key, copy in list(_host_copies.items()):
        if not copy.write_back():
            del _host_copies[key]


def synced(method):
    """A pycaffe method that computes on the device: the host copies go back first."""
    @functools.wraps(method)
    def call(*args, **kwargs):
        sync()
        return method(*args, **kwargs)
    return call


def after_sync(fn):
    """``fn`` (a user callback run in the middle of a pass) followed by :func:`sync`, so what it wrote through a view
    reaches the device before the pass goes on."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        result = fn(*args, **kwargs)
        sync()
        return result
    return call


class BlobView:
    """pycaffe's ``caffe.Blob`` over a layerforge Blob on a device: ``data`` and ``diff`` are numpy arrays (host
    copies, see the module docstring); ``shape``, ``count``, ``num`` / ``channels`` / ``height`` / ``width`` and
    ``reshape(*shape)`` are the blob's."""

    def __init__(self, blob):
        object.__setattr__(self, "blob", blob)

    @property
    def data(self):
        return host(self.blob, "data")

    @property
    def diff(self):
        return host(self.blob, "diff")

    @synced
    def reshape(self, *shape):
        return self.blob.reshape(*shape)

    def __getattr__(self, name):
        return getattr(self.blob, name)

    def __repr__(self):
        return f"<caffe.Blob view of {self.blob!r}>"


class LayerView:
    """A layer as pycaffe shows it: the layerforge Layer, with ``blobs`` as :class:`BlobView` views."""

    def __init__(self, layer):
        object.__setattr__(self, "layer", layer)

    @property
    def blobs(self):
        return views(self.layer.blobs)

    def __getattr__(self, name):
        return getattr(self.layer, name)

    def __repr__(self):
        return f"<caffe.Layer view of {self.layer!r}>"


def on_device(net):
    """True when ``net`` (a layerforge Net) computes on a device, where pycaffe shows views."""
    return net.xp is not numpy


def views(blobs):
    """``blobs`` (a list of layerforge Blobs) as :class:`BlobView` views."""
    return [BlobView(b) for b in blobs]
