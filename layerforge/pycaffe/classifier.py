"""pycaffe's ``caffe.Classifier``: a Net that classifies (H, W, K) images, scaled and cropped as Caffe's does."""
import numpy

from . import io
from .net import TEST, Net


def input_transformer(net, mean=None, input_scale=None, raw_scale=None, channel_swap=None):
    """The io.Transformer of ``net``'s first input for (H, W, K) images: transpose to (K, H, W), then the given
    channel swap, raw scale, mean and input scale (the preprocessing Classifier and Detector share)."""
    name = net.inputs[0]
    transformer = io.Transformer({name: net.blobs[name].data.shape})
    transformer.set_transpose(name, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(name, mean)
    if input_scale is not None:
        transformer.set_input_scale(name, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(name, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(name, channel_swap)
    return transformer


class Classifier(Net):
    """``Classifier(model_file, pretrained_file, image_dims=None, mean=None, input_scale=None, raw_scale=None,
    channel_swap=None)``: the TEST net with these weights.

    ``predict`` resizes images to ``image_dims`` (default: the net input's H x W), takes the net-input-sized crops
    (ten: four corners and the centre, each also mirrored, averaged; or the centre only), preprocesses them
    (see :func:`input_transformer`) and returns the first output, (N, classes).
    """

    def __init__(self, model_file, pretrained_file, image_dims=None, mean=None, input_scale=None, raw_scale=None,
                 channel_swap=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.crop_dims = numpy.array(self.blobs[self.inputs[0]].data.shape[2:])
        self.image_dims = self.crop_dims if image_dims is None or not len(image_dims) else image_dims

    def predict(self, inputs, oversample=True):
        """Class scores of ``inputs`` (a sequence of (H, W, K) float images): (N, C), averaged over the ten crops
        with ``oversample``, of the centre crop otherwise."""
        h, w = int(self.image_dims[0]), int(self.image_dims[1])
        images = numpy.zeros((len(inputs), h, w, inputs[0].shape[2]), numpy.float32)
        for i, image in enumerate(inputs):
            images[i] = io.resize_image(image, (h, w))
        if oversample:
            crops = io.oversample(images, self.crop_dims)
        else:
            crops = images[center_crop_slices(self.image_dims, self.crop_dims)]
        name = self.inputs[0]
        batch = numpy.stack([self.transformer.preprocess(name, crop) for crop in crops])
        predictions = self.forward_all(**{name: batch})[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape(len(predictions) // 10, 10, -1).mean(1)
        return predictions


def center_crop_slices(image_dims, crop_dims):
    """The index of the centred ``crop_dims`` crop of (N, H, W, K) images of ``image_dims``: pycaffe's bounds,
    centre -/+ half the crop, truncated to integers."""
    center = numpy.asarray(image_dims, numpy.float64) / 2.0
    half = numpy.asarray(crop_dims, numpy.float64) / 2.0
    y0, x0 = (center - half).astype(int)
    y1, x1 = (center + half).astype(int)
    return slice(None), slice(y0, y1), slice(x0, x1)
