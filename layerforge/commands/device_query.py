"""``layerforge device_query --gpu N``: a CUDA device's properties, as Caffe's ``caffe device_query -gpu N``."""
import logging

from ..backend import gpu_array_module
from ..logs import setup_logging

HELP = "print a CUDA device's properties (Caffe's caffe device_query)"

# (label as Caffe prints it, cudaDeviceProp field)
FIELDS = (("Major revision number", "major"), ("Minor revision number", "minor"), ("Name", "name"),
          ("Total global memory", "totalGlobalMem"), ("Total shared memory per block", "sharedMemPerBlock"),
          ("Total registers per block", "regsPerBlock"), ("Warp size", "warpSize"),
          ("Maximum memory pitch", "memPitch"), ("Maximum threads per block", "maxThreadsPerBlock"),
          ("Maximum dimension of block", "maxThreadsDim"), ("Maximum dimension of grid", "maxGridSize"),
          ("Clock rate", "clockRate"), ("Total constant memory", "totalConstMem"),
          ("Texture alignment", "textureAlignment"), ("Number of multiprocessors", "multiProcessorCount"))


def add_arguments(parser):
    parser.add_argument("--gpu", type=int, default=0, metavar="N", help="the device (default 0)")


def run(args):
    setup_logging()
    cupy = gpu_array_module(args.gpu, "device_query")
    props = cupy.cuda.runtime.getDeviceProperties(args.gpu)
    log = logging.getLogger("layerforge")
    log.info("%-31s%s", "Device id:", args.gpu)
    for label, key in FIELDS:
        if key not in props:  # a property this cupy (or the emulated device) does not report
            continue
        value = props[key]
        value = value.decode() if isinstance(value, bytes) else value
        value = ", ".join(map(str, value)) if isinstance(value, (tuple, list)) else value
        log.info("%-31s%s", f"{label}:", value)
    return 0
