"""Interpreter start with this folder on PYTHONPATH: install the caffe finder (layerforge_caffe_finder.py), so that
a Caffe checkout's uncompiled ``python/`` put ahead on sys.path still gives layerforge.pycaffe; then run the
sitecustomize this file hides, if there is one."""
import layerforge_caffe_finder

layerforge_caffe_finder.install()
layerforge_caffe_finder.run_shadowed_sitecustomize(__file__)
