"""Caffe's output lengths of a convolution or pooling window sliding over one axis (CPU and GPU bodies alike)."""


def conv_output_size(size, k, s, p, d=1):
    """Caffe's convolution output length: ``floor((size + 2p - (d (k - 1) + 1)) / s) + 1``."""
    return (size + 2 * p - (d * (k - 1) + 1)) // s + 1


def pooling_output_size(size, k, s, p, ceil_mode=True, padded=None):
    """Caffe's pooling output length: ``ceil((size + 2p - k) / s) + 1`` (floor when ``ceil_mode`` is False).

    When the layer has padding on any axis (``padded``; default: this axis's ``p`` > 0), a last window
    that would start in the right/bottom padding, ``(out - 1) s >= size + p``, is dropped, so every
    window starts inside the image or the left/top pad. Caffe tests this on both axes when either has
    padding, so an axis without padding can lose its last ceil-mode window too.
    """
    span = size + 2 * p - k
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if (p > 0 if padded is None else padded) and (out - 1) * s >= size + p:
        out -= 1
    return out
