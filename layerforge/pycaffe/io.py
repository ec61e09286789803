"""pycaffe's ``caffe.io``: images in and out of a net's input layout (H x W x K floats <-> K x H x W blobs).

The Transformer applies, in this order, to an (H', W', K) float image: resize to the input's H x W,
transpose (e.g. (2, 0, 1) for K x H x W), channel swap (RGB -> BGR), raw scale (e.g. [0, 1] -> [0, 255]),
mean subtraction and input scale; ``deprocess`` undoes them in reverse order (without the resize).
Images are read and resized with OpenCV; ``load_image`` returns RGB floats in [0, 1] as pycaffe does.
"""
import numpy

from ..errors import LayerforgeError


class Transformer:
    """Preprocessing per input blob: ``Transformer({"data": net.blobs["data"].data.shape})``."""

    def __init__(self, inputs):
        self.inputs = {name: tuple(shape) for name, shape in inputs.items()}
        self.transpose, self.channel_swap, self.raw_scale, self.mean, self.input_scale = {}, {}, {}, {}, {}

    def _check(self, name):
        if name not in self.inputs:
            raise LayerforgeError(f"{name} is not one of the net inputs: {sorted(self.inputs)}")

    def preprocess(self, name, data):
        """(H', W', K) array -> (K, H, W) float32 blob data for input ``name``."""
        self._check(name)
        x = numpy.asarray(data).astype(numpy.float32, copy=False)
        size = self.inputs[name][2:]
        if x.shape[:2] != size:
            x = resize_image(x, size)
        if name in self.transpose:
            x = x.transpose(self.transpose[name])
        if name in self.channel_swap:
            x = x[list(self.channel_swap[name]), :, :]
        if name in self.raw_scale:
            x = x * self.raw_scale[name]
        if name in self.mean:
            x = x - self.mean[name]
        if name in self.input_scale:
            x = x * self.input_scale[name]
        return x.astype(numpy.float32, copy=False)

    def deprocess(self, name, data):
        """Blob data -> the image layout it came from (the inverse of ``preprocess`` but for resizing)."""
        self._check(name)
        x = numpy.array(data, dtype=numpy.float64).squeeze()
        if name in self.input_scale:
            x = x / self.input_scale[name]
        if name in self.mean:
            x = x + self.mean[name]
        if name in self.raw_scale:
            x = x / self.raw_scale[name]
        if name in self.channel_swap:
            x = x[numpy.argsort(self.channel_swap[name]), :, :]
        if name in self.transpose:
            x = x.transpose(numpy.argsort(self.transpose[name]))
        return x

    def set_transpose(self, name, order):
        self._check(name)
        if len(order) != len(self.inputs[name]) - 1:
            raise LayerforgeError(f"transpose order {tuple(order)} needs {len(self.inputs[name]) - 1} axes")
        self.transpose[name] = tuple(order)

    def set_channel_swap(self, name, order):
        self._check(name)
        if len(order) != self.inputs[name][1]:
            raise LayerforgeError(f"channel swap {tuple(order)} needs {self.inputs[name][1]} channels")
        self.channel_swap[name] = tuple(order)

    def set_raw_scale(self, name, scale):
        self._check(name)
        self.raw_scale[name] = scale

    def set_mean(self, name, mean):
        """A per-channel mean (K,) or a mean image (K, H, W) (resized to the input when its size differs)."""
        self._check(name)
        mean = numpy.asarray(mean)
        shape = self.inputs[name]
        if mean.ndim == 1:
            if mean.shape[0] != shape[1]:
                raise LayerforgeError(f"mean has {mean.shape[0]} channels, input '{name}' has {shape[1]}")
            mean = mean[:, None, None]
        else:
            mean = mean[None] if mean.ndim == 2 else mean
            if mean.ndim != 3:
                raise LayerforgeError(f"mean must be (K,), (H, W) or (K, H, W), got shape {mean.shape}")
            if mean.shape != shape[1:]:
                mean = resize_image(mean.transpose(1, 2, 0), shape[2:]).transpose(2, 0, 1)
        self.mean[name] = mean

    def set_input_scale(self, name, scale):
        self._check(name)
        self.input_scale[name] = scale


# skimage's rgb2gray weights (ITU-R BT.709 luma), which pycaffe's load_image applies through skimage.io.imread
RGB_TO_GRAY = (0.2125, 0.7154, 0.0721)


def load_image(filename, color=True):
    """An image file as float32 in [0, 1]: (H, W, 3) RGB, or (H, W, 1) grey with ``color=False``.

    Grey from a colour file is skimage's ``rgb2gray`` of the RGB floats, as pycaffe computes it (pure red 200 ->
    0.2125 * 200 / 255 = 0.1667), not OpenCV's BT.601 grey.
    """
    from ..data.images import decode_image

    try:
        data = numpy.fromfile(filename, dtype=numpy.uint8)
    except OSError as e:
        raise LayerforgeError(f"{filename}: cannot read the image: {e.strerror}") from None
    image = decode_image(data, True, filename)
    if image is None:
        raise LayerforgeError(f"{filename}: cannot read the image (missing, or not an image)")
    rgb = image[::-1].transpose(1, 2, 0) / 255.0  # OpenCV's BGR (C, H, W) -> pycaffe's RGB (H, W, C), float64
    if color:
        return rgb.astype(numpy.float32)
    return (rgb @ numpy.array(RGB_TO_GRAY))[:, :, None].astype(numpy.float32)


def resize_image(image, new_dims, interp_order=1):
    """(H, W, K) -> (new_dims[0], new_dims[1], K); ``interp_order`` 0 nearest, 1 bilinear, 3 bicubic."""
    import cv2

    image = numpy.asarray(image, dtype=numpy.float32)
    h, w = int(new_dims[0]), int(new_dims[1])
    flag = {0: cv2.INTER_NEAREST, 1: cv2.INTER_LINEAR, 3: cv2.INTER_CUBIC}.get(interp_order, cv2.INTER_LINEAR)
    k = image.shape[-1]
    if k <= 512:  # OpenCV resizes up to 512 channels at once (and drops a trailing axis of 1)
        return cv2.resize(image, (w, h), interpolation=flag).reshape(h, w, k)
    return numpy.stack([cv2.resize(image[..., c], (w, h), interpolation=flag) for c in range(k)], -1)


def oversample(images, crop_dims):
    """Ten crops per image (the four corners and the centre, each also mirrored): (10 N, h, w, K)."""
    images = numpy.asarray(images)
    h, w = images.shape[1:3]
    ch, cw = int(crop_dims[0]), int(crop_dims[1])
    starts = [(0, 0), (0, w - cw), (h - ch, 0), (h - ch, w - cw), ((h - ch) // 2, (w - cw) // 2)]
    crops = []
    for image in images:
        five = [image[y:y + ch, x:x + cw] for y, x in starts]
        crops += five + [c[:, ::-1] for c in five]
    return numpy.stack(crops)


def blobproto_to_array(blob, return_diff=False):
    """A BlobProto's data (or diff) as an array of its shape (legacy num/channels/height/width too)."""
    from ..caffe import caffe_pb
    from ..caffe.caffemodel import blob_to_array

    if not return_diff:
        return _as_value_error(blob_to_array, blob)
    values = caffe_pb.BlobProto()
    values.CopyFrom(blob)
    values.ClearField("data")
    values.ClearField("double_data")
    values.data.extend(blob.diff)
    values.double_data.extend(blob.double_diff)
    return _as_value_error(blob_to_array, values)


def _as_value_error(convert, blob):
    # pycaffe reports a BlobProto whose values do not fill its shape as numpy's ValueError
    try:
        return convert(blob)
    except LayerforgeError as e:
        raise ValueError(str(e)) from None


def array_to_blobproto(arr, diff=None):
    """An N-d array (and optionally its diff) as a BlobProto with a ``shape``."""
    from ..caffe.caffemodel import array_to_blob

    blob = array_to_blob(numpy.asarray(arr, dtype=numpy.float32))
    if diff is not None:
        blob.diff.extend(numpy.asarray(diff, dtype=numpy.float32).ravel().tolist())
    return blob


def arraylist_to_blobprotovector_str(arraylist):
    """A list of arrays as a serialized BlobProtoVector."""
    from ..caffe import caffe_pb

    vec = caffe_pb.BlobProtoVector()
    vec.blobs.extend([array_to_blobproto(a) for a in arraylist])
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(data):
    """A serialized BlobProtoVector as a list of arrays."""
    from ..caffe import caffe_pb

    vec = caffe_pb.BlobProtoVector()
    vec.ParseFromString(data)
    return [blobproto_to_array(b) for b in vec.blobs]


def array_to_datum(arr, label=None):
    """A (C, H, W) array as a Datum: uint8 as bytes in ``data``, other dtypes in ``float_data``."""
    from ..data.datum import array_to_datum as to_datum

    if numpy.asarray(arr).ndim != 3:
        raise ValueError("Incorrect array shape.")
    return to_datum(arr, label)


def datum_to_array(datum):
    """A Datum's values as a (C, H, W) array (uint8 from ``data``, float from ``float_data``); not the label."""
    from ..data.datum import datum_to_array as to_array

    return to_array(datum)[0]
