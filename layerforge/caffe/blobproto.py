"""Caffe's ``.binaryproto`` files: one binary BlobProto, e.g. the mean image written by compute_image_mean.

Caffe writes a mean as a legacy 4-d blob (num 1, channels, height, width) of float ``data``; a reader
accepts that, a ``shape`` and ``double_data`` as well (layerforge.caffe.caffemodel.blob_to_array).
"""
import os

from . import caffe_pb
from .caffemodel import array_to_blob, blob_to_array, read_message, write_message


def read_blobproto(path):
    """The array a .binaryproto holds, in its declared shape (a mean is (1, C, H, W))."""
    proto = read_message(path, caffe_pb.BlobProto, "Caffe .binaryproto blob")
    return blob_to_array(proto, os.fspath(path))


def write_blobproto(path, array, legacy=True):
    """Write ``array`` as a .binaryproto (atomically); ``legacy`` uses num/channels/height/width as Caffe's tools do."""
    write_message(path, array_to_blob(array, legacy=legacy))
