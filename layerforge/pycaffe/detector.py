"""pycaffe's ``caffe.Detector``: R-CNN style windowed detection, each window warped to the net input and classified.

Windows are (ymin, xmin, ymax, xmax) pixel boxes. With ``context_pad`` p, the box is grown so that a p-pixel border
of the warped input is surrounding context (R-CNN's feature extraction); the part of that border outside the image
is the mean (in raw image values).
"""
import math
import os

import numpy

from ..errors import LayerforgeError
from . import io
from .classifier import input_transformer
from .net import TEST, Net


def _round(x):
    # Caffe's detector ran under Python 2, whose round() takes halves away from zero (the values here are >= 0)
    return int(math.floor(x + 0.5))


class Detector(Net):
    """``Detector(model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None, channel_swap=None,
    context_pad=None)``: the TEST net with these weights, its first input preprocessed as Classifier's."""

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None, channel_swap=None,
                 context_pad=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows):
        """Classify windows of images: ``images_windows`` is an iterable of (image file, windows), windows (n, 4)
        boxes. Returns one ``{"filename", "window", "prediction"}`` dict per window, in order."""
        images_windows = [(name, list(windows)) for name, windows in images_windows]
        crops = []
        for name, windows in images_windows:
            image = io.load_image(name)
            crops.extend(self.crop(image, window) for window in windows)
        if not crops:
            return []
        in_ = self.inputs[0]
        batch = numpy.stack([self.transformer.preprocess(in_, crop) for crop in crops])
        predictions = self.forward_all(**{in_: batch})[self.outputs[0]]
        detections = [{"window": window, "filename": name}
                      for name, windows in images_windows for window in windows]
        for detection, prediction in zip(detections, predictions):
            detection["prediction"] = prediction
        return detections

    def detect_selective_search(self, image_fnames):
        """Detect over Selective Search proposals, made by the MATLAB package ``selective_search_ijcv_with_python``
        as in Caffe (layerforge does not ship it: without it, give windows to :meth:`detect_windows`)."""
        try:
            import selective_search_ijcv_with_python as selective_search
        except ImportError:
            raise LayerforgeError("selective search needs the MATLAB package selective_search_ijcv_with_python, "
                                  "which is not installed; give the windows yourself: Detector.detect_windows, or "
                                  "detect.py --crop_mode=list with a CSV of filename,ymin,xmin,ymax,xmax") from None
        image_fnames = [os.path.abspath(f) for f in image_fnames]  # MATLAB runs elsewhere
        windows = selective_search.get_windows(image_fnames, cmd="selective_search_rcnn")
        return self.detect_windows(zip(image_fnames, windows))

    def crop(self, im, window):
        """The window (ymin, xmin, ymax, xmax) of ``im`` (H, W, K): as it is without context padding, else the
        grown box warped into a net-input-sized crop with mean where the box leaves the image."""
        window = [int(v) for v in window]
        if not self.context_pad:
            return im[window[0]:window[2], window[1]:window[3]]
        size = self.blobs[self.inputs[0]].width  # the input is square
        scale = size / (size - 2.0 * self.context_pad)
        half_h = (window[2] - window[0] + 1) / 2.0
        half_w = (window[3] - window[1] + 1) / 2.0
        center = numpy.array([window[0] + half_h, window[1] + half_w] * 2)
        box = numpy.round(center + scale * numpy.array([-half_h, -half_w, half_h, half_w]))
        scale_h, scale_w = size / (box[2] - box[0] + 1), size / (box[3] - box[1] + 1)
        pad_y = _round(max(0.0, -box[0]) * scale_h)  # the part of the box above / left of the image
        pad_x = _round(max(0.0, -box[1]) * scale_w)
        im_h, im_w = im.shape[:2]
        box = numpy.clip(box, 0.0, [im_h, im_w, im_h, im_w])
        clip_h, clip_w = box[2] - box[0] + 1, box[3] - box[1] + 1
        if clip_h <= 0 or clip_w <= 0:
            raise LayerforgeError(f"window {tuple(window)} lies outside the {im_h}x{im_w} image")
        crop_h = min(_round(clip_h * scale_h), size - pad_y)
        crop_w = min(_round(clip_w * scale_w), size - pad_x)
        y0, x0, y1, x1 = (int(v) for v in box)
        context = io.resize_image(im[y0:y1, x0:x1], (crop_h, crop_w))
        crop = numpy.ones(self.crop_dims, numpy.float32) * self.crop_mean
        crop[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = context
        return crop

    def configure_crop(self, context_pad):
        """Set ``crop_dims`` (the net input as H, W, K) and ``context_pad``; with context, ``crop_mean``: the
        transformer's mean taken back to raw image values (H, W, K order, channels unswapped, raw scale undone)."""
        in_ = self.inputs[0]
        transpose = self.transformer.transpose[in_]
        back = [transpose[t] for t in transpose]
        self.crop_dims = numpy.array(self.blobs[in_].data.shape[1:])[back]
        self.context_pad = context_pad
        if not context_pad:
            return
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = numpy.zeros(self.crop_dims, numpy.float32)
            return
        crop_mean = numpy.array(mean, numpy.float32).transpose(back)
        swap = self.transformer.channel_swap.get(in_)
        if swap is not None:
            crop_mean = crop_mean[:, :, [list(swap).index(c) for c in range(crop_mean.shape[2])]]
        raw_scale = self.transformer.raw_scale.get(in_)
        if raw_scale is not None:
            crop_mean = crop_mean / raw_scale
        self.crop_mean = crop_mean
