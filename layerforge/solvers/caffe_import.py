"""A Caffe prototxt, net or solver, as a layerforge mapping that its loader accepts (``layerforge convert``,
pycaffe's ``caffe.draw`` and ``NetSpec.to_yaml``; docs/caffe-import.md).

layerforge/net/caffe_net.py and layerforge/solvers/caffe_solver.py translate the messages; here the result is read
back by the net or solver loader, so that a problem the translation lets through is a ConfigError naming the
prototxt's line.
"""
from ..caffe.prototxt import parse_file
from ..errors import ConfigError
from ..net.netdef import load_net_def
from . import caffe_solver
from .param import load_solver_param
from .solver import SOLVER_REGISTRY


def convert_message(msg, path=None, rename_net=None):
    """A parsed Caffe prototxt (layerforge.caffe.prototxt.parse) -> ``(kind, mapping, notes)``, the mapping
    checked by the loader of its kind, so an error names the prototxt's line; ConfigError on any problem."""
    kind, mapping, notes = caffe_solver.message_to_mapping(msg, path, rename_net)
    try:
        if kind == "net":
            load_net_def(mapping, path)
        else:
            load_solver_param(mapping, SOLVER_REGISTRY)
    except ConfigError as e:
        key = (e.key or "").split(".")[0]
        line = e.line if kind == "net" or not key else mapping.line_of(key)
        raise ConfigError(e.message, path, line, e.layer, e.layer_type, e.key) from None
    return kind, mapping, notes


def convert_file(path, rename_net=None):
    """Read a Caffe .prototxt (net or solver) -> ``(kind, mapping, notes)``, checked as :func:`convert_message`."""
    return convert_message(parse_file(path), str(path), rename_net)
