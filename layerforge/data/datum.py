"""Caffe's Datum records (one image and its label, as Caffe's convert_imageset stores them in LMDB).

A Datum holds either raw ``data`` (uint8 bytes, C x H x W channel-major), or ``float_data`` (C*H*W
floats, used when ``data`` is empty), or, with ``encoded: true``, an image file's bytes in ``data``
(PNG/JPEG...), decoded here by OpenCV as Caffe's DecodeDatumToCVMatNative does: channels as the file
has them (grey -> 1, colour -> 3 in BGR order), ``channels``/``height``/``width`` unused.
"""
import numpy
from google.protobuf.message import DecodeError

from ..errors import DataError
from ..caffe.caffe_pb import Datum


def array_to_datum(array, label=0):
    """A Datum of ``array`` (C, H, W): uint8 into ``data``, any other dtype into ``float_data``; ``label``
    None leaves the field unset (reads back as 0)."""
    array = numpy.asarray(array)
    if array.ndim != 3:
        raise ValueError(f"a Datum holds a (C, H, W) array, got shape {array.shape}")
    datum = Datum(channels=array.shape[0], height=array.shape[1], width=array.shape[2])
    if label is not None:
        datum.label = int(label)
    if array.dtype == numpy.uint8:
        datum.data = array.tobytes()
    else:
        datum.float_data.extend(array.astype(numpy.float32).ravel().tolist())
    return datum


def encoded_datum(data, label=0):
    """A Datum holding an encoded image file's bytes (as convert_imageset --encoded writes it)."""
    return Datum(data=bytes(data), label=int(label), encoded=True)


def datum_to_array(datum, where="Datum"):
    """``(array, label)``: array (C, H, W) uint8 (``data`` or encoded) or float32 (``float_data``).

    Raises DataError naming ``where`` when the values do not fit the shape or the image cannot be decoded.
    """
    if datum.encoded:
        from .images import decode_image  # OpenCV's and libjpeg's own messages are caught there

        image = decode_image(numpy.frombuffer(datum.data, numpy.uint8), None, where)
        if image is None:
            raise DataError(f"{where}: the encoded image ({len(datum.data)} bytes) cannot be decoded")
        if image.dtype != numpy.uint8:
            raise DataError(f"{where}: the encoded image has {image.dtype} pixels; only 8-bit images are read")
        return image, datum.label
    shape = (datum.channels, datum.height, datum.width)
    count = shape[0] * shape[1] * shape[2]
    if count == 0:
        raise DataError(f"{where}: the Datum's shape {shape[0]}x{shape[1]}x{shape[2]} holds no values")
    if datum.data:
        if len(datum.data) != count:
            raise DataError(f"{where}: {len(datum.data)} bytes of data do not fill the Datum's shape "
                            f"{shape[0]}x{shape[1]}x{shape[2]}")
        return numpy.frombuffer(datum.data, numpy.uint8).reshape(shape), datum.label
    if len(datum.float_data) != count:
        raise DataError(f"{where}: {len(datum.float_data)} float_data values do not fill the Datum's shape "
                        f"{shape[0]}x{shape[1]}x{shape[2]}")
    return numpy.array(datum.float_data, numpy.float32).reshape(shape), datum.label


def decode_datum(value, source="<record>", key=b"?"):
    """``(array, label)`` from a serialized Datum; DataError naming ``source`` and ``key`` when it is corrupted."""
    k = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    datum = Datum()
    try:
        datum.ParseFromString(bytes(value))
    except DecodeError as e:
        raise DataError(f"{source}: key '{k}': corrupted Datum record: {e}") from None
    return datum_to_array(datum, f"{source}: key '{k}'")
