"""``caffe.proto``: Caffe's protobuf messages (``caffe_pb2``), from layerforge.caffe.caffe_pb."""
