"""Caffe migration: a protobuf text-format parser and NetParameter / SolverParameter -> layerforge YAML.

``prototxt.parse_file(path)`` reads any .prototxt into a schema-less :class:`~.prototxt.Message`;
``convert.convert_file(path)`` turns a Caffe net or solver into a layerforge mapping and
``convert.to_yaml`` writes it. docs/caffe-import.md lists what maps to what.

Caffe's binary files (docs/caffe-formats.md): ``caffe_pb`` builds Caffe's protobuf message classes from
our own schema table; ``caffemodel`` reads and writes .caffemodel / .caffemodel.h5 weights,
``solverstate`` Caffe-format snapshots, ``blobproto`` .binaryproto means, ``datum`` Datum records.
"""
