"""``import caffe`` for scripts and tests written for Caffe: this package stands in for layerforge.pycaffe.

Caffe is used from Python by putting ``caffe/python`` on PYTHONPATH; the same step with layerforge::

    export PYTHONPATH=$(python -m layerforge.pycaffe --python-path):$PYTHONPATH

after which ``import caffe`` (and ``caffe.proto.caffe_pb2``, ``caffe.io``, ``caffe.draw``, ``caffe.net_spec``,
``caffe.coord_map``, ``caffe.classifier``, ``caffe.detector``, ``caffe.pycaffe``) are layerforge.pycaffe and its modules: the same module objects, so
``caffe.Net is layerforge.pycaffe.Net``. Nothing is installed under the name ``caffe`` by default, so a
real Caffe on the path is never shadowed; a Caffe checkout's uncompiled ``python/`` put ahead of this folder is
(layerforge_caffe_finder.py).
"""
import importlib
import sys

_pycaffe = importlib.import_module("layerforge.pycaffe")
for _name in ("proto", "proto.caffe_pb2", "io", "draw", "net_spec", "coord_map", "classifier", "detector"):
    sys.modules[f"caffe.{_name}"] = importlib.import_module(f"layerforge.pycaffe.{_name}")
sys.modules["caffe.pycaffe"] = _pycaffe  # Caffe's module of Net/Solver helpers; here they are the package's
_pycaffe.pycaffe = _pycaffe
sys.modules["caffe"] = _pycaffe
# put in place of a Caffe checkout's package (layerforge_caffe_finder.py): that package's other modules, a fork's
# pure-Python ones such as the SSD fork's model_libs, import from it after layerforge's own
for _folder in __path__[1:]:
    if _folder not in _pycaffe.__path__:
        _pycaffe.__path__.append(_folder)
