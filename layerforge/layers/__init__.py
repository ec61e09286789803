"""Layer types, registered by their Caffe type names in ``LAYER_REGISTRY``."""
import numpy

from .base import LAYER_REGISTRY, Layer, register_layer

# Importing a module registers its layer types.
from . import (  # noqa: F401,E402
    accuracy,
    annotated_data,
    argmax,
    batch_norm,
    batch_reindex,
    bias,
    bn,
    concat,
    conv,
    cpm_data,
    crop,
    data,
    deconv,
    dense_image_data,
    detection_evaluate,
    detection_output,
    dropout,
    eltwise,
    embed,
    filter,
    hdf5,
    im2col_layer,
    inner_product,
    input,
    loss,
    lrn,
    memory_data,
    multibox_loss,
    mvn,
    neuron,
    normalize,
    parameter,
    permute,
    pooling,
    prior_box,
    python_layer,
    recurrent,
    reduction,
    roi_pooling,
    scale,
    shape,
    silence,
    smooth_l1_loss,
    softmax,
    spp,
    synthetic_data,
    tile,
    token_data,
    upsample,
    video_data,
    window_data,
)
from .layer_param import parse_layer  # noqa: E402


def create_layer(definition, phase="TRAIN", dtype=numpy.float32, xp=numpy):
    """Validate one layer definition (a dict as in the YAML ``layers`` list) and instantiate it.

    ``create_layer({"name": "c1", "type": "Convolution", "convolution": {"num_output": 8, "kernel_size": 3}})``
    returns a Layer that is not yet set up (call ``layer.setup(bottom, top)`` with Blobs).
    """
    definition = dict(definition)
    definition.setdefault("name", definition.get("type", "layer").lower())
    lp = parse_layer(definition)
    return LAYER_REGISTRY[lp.type](lp, phase=phase, dtype=dtype, xp=xp)


__all__ = ["LAYER_REGISTRY", "Layer", "register_layer", "create_layer"]
