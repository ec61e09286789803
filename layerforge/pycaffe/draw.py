"""pycaffe's ``caffe.draw``: a NetParameter message drawn as a graph (layers as boxes, blobs on the edges).

The net is not built (its data need not exist): the drawing comes from the definition, as Caffe's does.
Files go through Graphviz's ``dot`` when it is installed, through matplotlib otherwise (layerforge/net/drawing.py,
which ``layerforge draw`` uses too).
"""
import os
import tempfile

from ..net.drawing import definition_graph, render, to_dot

_PHASES = {None: "TRAIN", 0: "TRAIN", 1: "TEST"}


def _graph(caffe_net, phase):
    from ..solvers.caffe_import import convert_message
    from ..caffe.prototxt import parse
    from ..net.netdef import load_net_def
    from .net_spec import to_prototxt

    mapping = convert_message(parse(to_prototxt(caffe_net), "<NetParameter>"), "<NetParameter>")[1]
    return definition_graph(load_net_def(mapping), _PHASES.get(phase, phase))


def get_pydot_graph(caffe_net, rankdir, label_edges=True, phase=None, display_lrm=False):
    """The graph as DOT text (layerforge has no pydot: the text is what ``dot`` would read)."""
    return to_dot(caffe_net.name or "net", rankdir, _graph(caffe_net, phase))


def draw_net_to_file(caffe_net, filename, rankdir="LR", phase=None, display_lrm=False):
    """Draw ``caffe_net`` (a NetParameter) to ``filename`` (.png, .svg, .pdf or .dot by its extension)."""
    return render(caffe_net.name or "net", filename, rankdir, drawn=_graph(caffe_net, phase))


def draw_net(caffe_net, rankdir, ext="png", phase=None, display_lrm=False):
    """The drawing as the bytes of an ``ext`` image."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"net.{ext}")
        draw_net_to_file(caffe_net, path, rankdir, phase)
        with open(path, "rb") as f:
            return f.read()
