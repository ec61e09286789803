"""``import caffe`` -> layerforge.pycaffe also where a script puts a Caffe checkout's ``python/`` ahead on the path.

Caffe's example notebooks and scripts do ``sys.path.insert(0, caffe_root + 'python')`` before ``import caffe``.
Without a compiled Caffe, that package fails (``No module named 'caffe._caffe'``). This finder, first on
``sys.meta_path``, looks where the path would find ``caffe``: a Caffe package without its compiled ``_caffe``
extension is replaced by layerforge's stand-in (the ``caffe`` folder beside this file), and the modules layerforge
lacks (a fork's ``model_libs.py``) still import from the checkout; a built Caffe, or any other ``caffe``, is
left alone. Standard library only: it is imported at interpreter start, by the
``sitecustomize`` beside it (this folder on PYTHONPATH) or by the ``.pth`` file that
``python -m layerforge.pycaffe --install-hook`` writes.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STAND_IN = os.path.join(HERE, "caffe")


def has_compiled_caffe(package_dir):
    """True when ``package_dir`` (a ``caffe`` package folder) holds the ``_caffe`` extension Caffe's build makes."""
    try:
        names = os.listdir(package_dir)
    except OSError:
        return False
    return any(name == "_caffe" + suffix for name in names for suffix in importlib.machinery.EXTENSION_SUFFIXES)


class CaffeFinder(importlib.abc.MetaPathFinder):
    """Finds ``caffe`` as the path would, but a Caffe checkout's package without ``_caffe`` becomes the stand-in."""

    def find_spec(self, name, path=None, target=None):
        if name != "caffe":
            return None
        found = importlib.machinery.PathFinder.find_spec(name, sys.path)
        locations = getattr(found, "submodule_search_locations", None) if found is not None else None
        if not locations or os.path.abspath(locations[0]) == STAND_IN or has_compiled_caffe(locations[0]):
            return None  # nothing, a module, the stand-in itself, or a built Caffe: the path finder decides
        # the checkout's folder after the stand-in: a fork's pure-Python modules (the SSD fork's model_libs.py)
        # still import from it, on layerforge's caffe
        return importlib.util.spec_from_file_location("caffe", os.path.join(STAND_IN, "__init__.py"),
                                                      submodule_search_locations=[STAND_IN, locations[0]])


def install():
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, CaffeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, CaffeFinder())


def run_shadowed_sitecustomize(own_file):
    """Run the ``sitecustomize`` module that ``own_file`` hides further along ``sys.path`` (a distribution's own)."""
    own = os.path.abspath(own_file)
    for entry in sys.path:
        candidate = os.path.join(os.path.abspath(entry or "."), "sitecustomize.py")
        if candidate != own and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return
