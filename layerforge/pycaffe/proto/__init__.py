"""``caffe.proto``: Caffe's protobuf messages (``caffe_pb2``), from layerforge.caffe.caffe_pb."""
from . import caffe_pb2  # noqa: F401 - pycaffe scripts use caffe.proto.caffe_pb2 after a plain `import caffe`
