"""Python: a layer whose setup, reshape, forward and backward are methods of a user's class (pycaffe's caffe.Layer)."""
import importlib
import os
import re
import sys

import numpy

from ..blob import Blob
from ..errors import ConfigError, LayerforgeError
from ..schema import REQUIRED
from .base import Field, Layer, register_layer



class Phase(int):
    """pycaffe's ``caffe.TRAIN`` (0) / ``caffe.TEST`` (1): an int whose ``str`` is its name, as Caffe's enum's
    (py-faster-rcnn's layers look their settings up by ``str(self.phase)``)."""

    def __str__(self):
        return ("TRAIN", "TEST")[self]

    __repr__ = __str__


TRAIN, TEST = Phase(0), Phase(1)
PHASES = {"TRAIN": TRAIN, "TEST": TEST}
PATH_HINT = "export PYTHONPATH=$(python -m layerforge.pycaffe --python-path):$PYTHONPATH"
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class BlobVec(list):
    """A layer's parameter blobs, as pycaffe's ``layer.blobs``: a list with ``add_blob(*shape)``."""

    def __init__(self, dtype, xp):
        super().__init__()
        self.dtype, self.xp = dtype, xp

    def add_blob(self, *shape):
        """Append a zero-filled parameter Blob of ``shape`` (``add_blob(2, 3)`` or ``add_blob((2, 3))``)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        self.append(Blob(tuple(int(s) for s in shape), self.dtype, self.xp))
        return self[-1]


class PythonLayerBase:
    """Base class of the user's layers (pycaffe's ``caffe.Layer``).

    Before ``setup`` the Python layer sets ``self.param_str`` (python.param_str; also ``self.param_str_``, the
    name older pycaffe and py-faster-rcnn use), ``self.phase`` (:class:`Phase` TRAIN / TEST, 0 / 1, as pycaffe's
    caffe.TRAIN / caffe.TEST) and ``self.blobs`` (learnable parameters: add them with
    ``self.blobs.add_blob(*shape)`` in ``setup``). Bottoms and tops are Blobs: ``.data``, ``.diff``,
    ``.reshape(*shape)``, ``.shape``, ``.count``, ``.num`` / ``.channels`` / ``.height`` / ``.width``.
    ``backward`` assigns bottom diffs and adds into parameter diffs.
    """

    type = "Python"  # what pycaffe's net.layers[i].type says of a Python layer

    def __init__(self, layer_param=None):
        self.layer_param = layer_param
        self.param_str, self.phase, self.blobs = "", TRAIN, BlobVec(numpy.float32, numpy)

    @property
    def param_str_(self):
        return self.param_str

    @param_str_.setter
    def param_str_(self, value):
        self.param_str = value

    def setup(self, bottom, top):
        """Read ``self.param_str``, check bottoms, create ``self.blobs``."""

    def reshape(self, bottom, top):
        raise NotImplementedError(f"{type(self).__name__} defines no reshape(bottom, top)")

    def forward(self, bottom, top):
        raise NotImplementedError(f"{type(self).__name__} defines no forward(bottom, top)")

    def backward(self, top, propagate_down, bottom):
        raise NotImplementedError(f"{type(self).__name__} defines no backward(top, propagate_down, bottom)")


def import_layer_class(module, name, net_dir=None):
    """The class ``name`` of module ``module``; ValueError says why not.

    The module is looked for where Caffe users keep it: on sys.path (the running script's folder, PYTHONPATH,
    what the script added), then in ``net_dir`` (the net file's folder), then in the current directory; the
    folders found this way stay on sys.path while the module imports its own neighbours.
    """
    if not _DOTTED_NAME.match(module):
        raise ValueError(f"python.module '{module}' is not a module name (dotted identifiers)")
    fallbacks = [d for d in dict.fromkeys([net_dir, os.getcwd()]) if d is not None and d not in sys.path]
    sys.path.extend(fallbacks)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            where = "".join(f", {d}" for d in fallbacks)
            raise ValueError(f"python.module '{module}' not found on sys.path{where}") from None
        hint = f" (for layerforge's pycaffe as caffe: {PATH_HINT})" if e.name == "caffe" else ""
        raise ValueError(f"importing python.module '{module}' raised {type(e).__name__}: {e}{hint}") from e
    except Exception as e:  # noqa: BLE001 - the user's module: any failure becomes one line naming it
        raise ValueError(f"importing python.module '{module}' raised {type(e).__name__}: {e}") from e
    finally:
        for d in fallbacks:
            sys.path.remove(d)
    cls = getattr(mod, name, None)
    if not isinstance(cls, type):
        raise ValueError(f"python.module '{module}' has no class '{name}'")
    return cls


@register_layer("Python")
class Python(Layer):
    """Runs the methods of ``python.layer``, a class of module ``python.module``.

    The module is imported by name (sys.path, then the net file's folder, then the current directory), the class is instantiated with
    the layer parameter, ``param_str`` / ``phase`` / ``blobs`` are set (see PythonLayerBase), and Caffe's
    sequence calls ``setup(bottom, top)``, ``reshape(bottom, top)``, ``forward(bottom, top)`` and
    ``backward(top, propagate_down, bottom)`` on it. Any bottoms and tops; shapes are the class's to set.
    An exception raised by the class becomes one line naming the layer, module, class and message.
    """

    capturable = False  # user code runs on the host each pass

    num_bottom = (0, None)
    num_top = (0, None)
    param_blocks = {
        "python": {
            "module": Field("str", REQUIRED, doc="module to import (sys.path, the net file's folder, the current directory)"),
            "layer": Field("str", REQUIRED, doc="the class in the module (a caffe.Layer / PythonLayerBase)"),
            "param_str": Field("str", "", doc="handed to the instance as self.param_str before setup"),
            "share_in_parallel": Field("bool", False, doc="deprecated in Caffe; accepted and ignored"),
        },
    }

    def layer_setup(self, bottom, top):
        p = self.layer_param.python
        path = getattr(self.layer_param, "path", None)
        net_dir = os.path.dirname(os.path.abspath(path)) if path else None
        try:
            cls = import_layer_class(p.module, p.layer, net_dir)
        except ValueError as e:
            raise ConfigError(str(e), path, self.layer_param.line_of("python"), self.name, self.type) from e.__cause__
        self.impl = self.call(cls, self.layer_param, what="creating")
        self.blobs = BlobVec(self.dtype, self.xp)
        self.impl.param_str, self.impl.phase, self.impl.blobs = p.param_str, PHASES[self.phase], self.blobs
        self.impl.param_str_ = p.param_str
        self.call(self.impl.setup, bottom, top, what="setup")

    def call(self, method, *args, what):
        """``method(*args)``; the user's exception becomes a one-line error (ConfigError while setting up)."""
        try:
            return method(*args)
        except LayerforgeError:
            raise
        except Exception as e:  # noqa: BLE001 - user code: any failure becomes one line naming it
            p = self.layer_param.python
            message = f"python.module '{p.module}' class '{p.layer}': {what} raised {type(e).__name__}: {e}"
            if what in ("creating", "setup"):
                error = ConfigError(message, getattr(self.layer_param, "path", None),
                                    self.layer_param.line_of("python"), self.name, self.type)
            else:
                error = LayerforgeError(f"layer '{self.name}' (Python): {message}")
            error.user_exception = e  # pycaffe re-raises the user's own exception, as Caffe does
            raise error from e

    def reshape(self, bottom, top):
        self.call(self.impl.reshape, bottom, top, what="reshape")

    def forward(self, bottom, top):
        self.call(self.impl.forward, bottom, top, what="forward")

    def backward(self, top, propagate_down, bottom):
        self.call(self.impl.backward, top, list(propagate_down), bottom, what="backward")
