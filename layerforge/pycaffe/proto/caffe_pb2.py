"""``caffe.proto.caffe_pb2``: Caffe's message classes and enums (built by layerforge.caffe.caffe_pb)."""
from ...caffe.caffe_pb import *  # noqa: F401,F403
from ...caffe.caffe_pb import __all__  # noqa: F401
