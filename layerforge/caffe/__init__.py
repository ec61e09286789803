"""Caffe's file formats, read and written without a line of Caffe.

Text: ``prototxt.parse_file(path)`` reads any .prototxt into a schema-less :class:`~.prototxt.Message`;
``message_reader.MessageReader`` reads such a message against a layerforge schema (the nets' side is
layerforge/net/caffe_net.py, the solvers' layerforge/solvers/caffe_solver.py; ``layerforge convert`` writes
the YAML). docs/caffe-import.md lists what maps to what.

Binary (docs/caffe-formats.md): ``caffe_pb`` builds Caffe's protobuf message classes from our own schema
table; ``caffemodel`` reads and writes .caffemodel / .caffemodel.h5 weights, ``solverstate`` Caffe-format
snapshots, ``blobproto`` .binaryproto means, ``datum`` Datum records.
"""
