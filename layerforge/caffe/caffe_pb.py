"""Caffe's protobuf messages (package ``caffe``), built at import from the table below.

The table is our own transcription of the facts in Caffe's ``caffe.proto`` (proto2): for each message
its fields as ``(name, number, label, type[, default])``, label ``?`` optional, ``*`` repeated, ``*p``
repeated and packed, ``!`` required; a type is a scalar, or a message / enum named relative to the
message (nested enums are ``Message.Enum``). :func:`_file_descriptor` turns it into a
``FileDescriptorProto`` in a private descriptor pool, and every message class is importable from this
module under its Caffe name, with full names as Caffe's (``caffe.NetParameter``)::

    from layerforge.caffe.caffe_pb import NetParameter, BlobProto, Datum, TRAIN

Top-level enums are ``EnumTypeWrapper`` objects (``Phase.Value("TEST")``) and their values module
constants (``TRAIN``, ``TEST``), nested enums' values are class attributes (``PoolingParameter.MAX``),
as in protoc's ``caffe_pb2``. Fields a file carries that the table lacks are kept by protobuf as unknown
fields and written back unchanged. All reading and writing is the protobuf library's.

Beside BVLC's messages the table holds what widely used Caffe forks add to their ``caffe.proto`` (``FORKS``,
``FORK_MESSAGES``, ``FORK_ENUMS``, ``FORK_FIELDS``): SSD's detection messages, the BN and Upsample of SegNet
and ENet, Fast R-CNN's ROIPooling. They are merged into the one package ``caffe`` as those forks' own builds
have them, so a fork's caffemodel, LMDB record (``AnnotatedDatum``) or pycaffe script reads here. A fork field
whose number (or name) BVLC or an earlier fork already uses in that message (SegNet's ``upsample_param = 137``
is BVLC's ``embed_param``) cannot share the package: it is left out and listed in ``CLASHES``; a file of that
fork carrying it reads it as an unknown field (or as the other field where the wire types agree).
:func:`fork_of` names the fork a message or field comes from.
"""
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

PACKAGE = "caffe"

ENUMS = {
    "FillerParameter.VarianceNorm": (("FAN_IN", 0), ("FAN_OUT", 1), ("AVERAGE", 2)),
    "SolverParameter.SnapshotFormat": (("HDF5", 0), ("BINARYPROTO", 1)),
    "SolverParameter.SolverMode": (("CPU", 0), ("GPU", 1)),
    "SolverParameter.SolverType": (
        ("SGD", 0), ("NESTEROV", 1), ("ADAGRAD", 2), ("RMSPROP", 3), ("ADADELTA", 4), ("ADAM", 5),
    ),
    "Phase": (("TRAIN", 0), ("TEST", 1)),
    "ParamSpec.DimCheckMode": (("STRICT", 0), ("PERMISSIVE", 1)),
    "LossParameter.NormalizationMode": (("FULL", 0), ("VALID", 1), ("BATCH_SIZE", 2), ("NONE", 3)),
    "ConvolutionParameter.Engine": (("DEFAULT", 0), ("CAFFE", 1), ("CUDNN", 2)),
    "DataParameter.DB": (("LEVELDB", 0), ("LMDB", 1)),
    "EltwiseParameter.EltwiseOp": (("PROD", 0), ("SUM", 1), ("MAX", 2)),
    "HingeLossParameter.Norm": (("L1", 1), ("L2", 2)),
    "LRNParameter.NormRegion": (("ACROSS_CHANNELS", 0), ("WITHIN_CHANNEL", 1)),
    "LRNParameter.Engine": (("DEFAULT", 0), ("CAFFE", 1), ("CUDNN", 2)),
    "PoolingParameter.PoolMethod": (("MAX", 0), ("AVE", 1), ("STOCHASTIC", 2)),
    "PoolingParameter.Engine": (("DEFAULT", 0), ("CAFFE", 1), ("CUDNN", 2)),
    "PoolingParameter.RoundMode": (("CEIL", 0), ("FLOOR", 1)),
    "ReductionParameter.ReductionOp": (("SUM", 1), ("ASUM", 2), ("SUMSQ", 3), ("MEAN", 4)),
    "ReLUParameter.Engine": (("DEFAULT", 0), ("CAFFE", 1), ("CUDNN", 2)),
    "SigmoidParameter.Engine": (("DEFAULT", 0), ("CAFFE", 1), ("CUDNN", 2)),
    "SoftmaxParameter.Engine": (("DEFAULT", 0), ("CAFFE", 1), ("CUDNN", 2)),
    "TanHParameter.Engine": (("DEFAULT", 0), ("CAFFE", 1), ("CUDNN", 2)),
    "SPPParameter.PoolMethod": (("MAX", 0), ("AVE", 1), ("STOCHASTIC", 2)),
    "SPPParameter.Engine": (("DEFAULT", 0), ("CAFFE", 1), ("CUDNN", 2)),
    "V1LayerParameter.LayerType": (
        ("NONE", 0), ("ABSVAL", 35), ("ACCURACY", 1), ("ARGMAX", 30), ("BNLL", 2), ("CONCAT", 3),
        ("CONTRASTIVE_LOSS", 37), ("CONVOLUTION", 4), ("DATA", 5), ("DECONVOLUTION", 39), ("DROPOUT", 6),
        ("DUMMY_DATA", 32), ("EUCLIDEAN_LOSS", 7), ("ELTWISE", 25), ("EXP", 38), ("FLATTEN", 8), ("HDF5_DATA", 9),
        ("HDF5_OUTPUT", 10), ("HINGE_LOSS", 28), ("IM2COL", 11), ("IMAGE_DATA", 12), ("INFOGAIN_LOSS", 13),
        ("INNER_PRODUCT", 14), ("LRN", 15), ("MEMORY_DATA", 29), ("MULTINOMIAL_LOGISTIC_LOSS", 16), ("MVN", 34),
        ("POOLING", 17), ("POWER", 26), ("RELU", 18), ("SIGMOID", 19), ("SIGMOID_CROSS_ENTROPY_LOSS", 27),
        ("SILENCE", 36), ("SOFTMAX", 20), ("SOFTMAX_LOSS", 21), ("SPLIT", 22), ("SLICE", 33), ("TANH", 23),
        ("WINDOW_DATA", 24), ("THRESHOLD", 31),
    ),
    "V1LayerParameter.DimCheckMode": (("STRICT", 0), ("PERMISSIVE", 1)),
    "V0LayerParameter.PoolMethod": (("MAX", 0), ("AVE", 1), ("STOCHASTIC", 2)),
}

MESSAGES = {
    "BlobShape": (
        ("dim", 1, "*p", "int64"),
    ),
    "BlobProto": (
        ("shape", 7, "?", "BlobShape"), ("data", 5, "*p", "float"), ("diff", 6, "*p", "float"),
        ("double_data", 8, "*p", "double"), ("double_diff", 9, "*p", "double"), ("num", 1, "?", "int32", 0),
        ("channels", 2, "?", "int32", 0), ("height", 3, "?", "int32", 0), ("width", 4, "?", "int32", 0),
    ),
    "BlobProtoVector": (
        ("blobs", 1, "*", "BlobProto"),
    ),
    "Datum": (
        ("channels", 1, "?", "int32"), ("height", 2, "?", "int32"), ("width", 3, "?", "int32"),
        ("data", 4, "?", "bytes"), ("label", 5, "?", "int32"), ("float_data", 6, "*", "float"),
        ("encoded", 7, "?", "bool", False),
    ),
    "FillerParameter": (
        ("type", 1, "?", "string", "constant"), ("value", 2, "?", "float", 0.0), ("min", 3, "?", "float", 0.0),
        ("max", 4, "?", "float", 1.0), ("mean", 5, "?", "float", 0.0), ("std", 6, "?", "float", 1.0),
        ("sparse", 7, "?", "int32", -1), ("variance_norm", 8, "?", "VarianceNorm", "FAN_IN"),
    ),
    "NetParameter": (
        ("name", 1, "?", "string"), ("input", 3, "*", "string"), ("input_shape", 8, "*", "BlobShape"),
        ("input_dim", 4, "*", "int32"), ("force_backward", 5, "?", "bool", False), ("state", 6, "?", "NetState"),
        ("debug_info", 7, "?", "bool", False), ("layer", 100, "*", "LayerParameter"),
        ("layers", 2, "*", "V1LayerParameter"),
    ),
    "SolverParameter": (
        ("net", 24, "?", "string"), ("net_param", 25, "?", "NetParameter"), ("train_net", 1, "?", "string"),
        ("test_net", 2, "*", "string"), ("train_net_param", 21, "?", "NetParameter"),
        ("test_net_param", 22, "*", "NetParameter"), ("train_state", 26, "?", "NetState"),
        ("test_state", 27, "*", "NetState"), ("test_iter", 3, "*", "int32"), ("test_interval", 4, "?", "int32", 0),
        ("test_compute_loss", 19, "?", "bool", False), ("test_initialization", 32, "?", "bool", True),
        ("base_lr", 5, "?", "float"), ("display", 6, "?", "int32"), ("average_loss", 33, "?", "int32", 1),
        ("max_iter", 7, "?", "int32"), ("iter_size", 36, "?", "int32", 1), ("lr_policy", 8, "?", "string"),
        ("gamma", 9, "?", "float"), ("power", 10, "?", "float"), ("momentum", 11, "?", "float"),
        ("weight_decay", 12, "?", "float"), ("regularization_type", 29, "?", "string", "L2"),
        ("stepsize", 13, "?", "int32"), ("stepvalue", 34, "*", "int32"), ("clip_gradients", 35, "?", "float", -1.0),
        ("snapshot", 14, "?", "int32", 0), ("snapshot_prefix", 15, "?", "string"),
        ("snapshot_diff", 16, "?", "bool", False), ("snapshot_format", 37, "?", "SnapshotFormat", "BINARYPROTO"),
        ("solver_mode", 17, "?", "SolverMode", "GPU"), ("device_id", 18, "?", "int32", 0),
        ("random_seed", 20, "?", "int64", -1), ("type", 40, "?", "string", "SGD"),
        ("delta", 31, "?", "float", 1e-08), ("momentum2", 39, "?", "float", 0.999),
        ("rms_decay", 38, "?", "float", 0.99), ("debug_info", 23, "?", "bool", False),
        ("snapshot_after_train", 28, "?", "bool", True), ("solver_type", 30, "?", "SolverType", "SGD"),
        ("layer_wise_reduce", 41, "?", "bool", True), ("weights", 42, "*", "string"),
    ),
    "SolverState": (
        ("iter", 1, "?", "int32"), ("learned_net", 2, "?", "string"), ("history", 3, "*", "BlobProto"),
        ("current_step", 4, "?", "int32", 0),
    ),
    "NetState": (
        ("phase", 1, "?", "Phase", "TEST"), ("level", 2, "?", "int32", 0), ("stage", 3, "*", "string"),
    ),
    "NetStateRule": (
        ("phase", 1, "?", "Phase"), ("min_level", 2, "?", "int32"), ("max_level", 3, "?", "int32"),
        ("stage", 4, "*", "string"), ("not_stage", 5, "*", "string"),
    ),
    "ParamSpec": (
        ("name", 1, "?", "string"), ("share_mode", 2, "?", "DimCheckMode"), ("lr_mult", 3, "?", "float", 1.0),
        ("decay_mult", 4, "?", "float", 1.0),
    ),
    "LayerParameter": (
        ("name", 1, "?", "string"), ("type", 2, "?", "string"), ("bottom", 3, "*", "string"),
        ("top", 4, "*", "string"), ("phase", 10, "?", "Phase"), ("loss_weight", 5, "*", "float"),
        ("param", 6, "*", "ParamSpec"), ("blobs", 7, "*", "BlobProto"), ("propagate_down", 11, "*", "bool"),
        ("include", 8, "*", "NetStateRule"), ("exclude", 9, "*", "NetStateRule"),
        ("transform_param", 100, "?", "TransformationParameter"), ("loss_param", 101, "?", "LossParameter"),
        ("accuracy_param", 102, "?", "AccuracyParameter"), ("argmax_param", 103, "?", "ArgMaxParameter"),
        ("batch_norm_param", 139, "?", "BatchNormParameter"), ("bias_param", 141, "?", "BiasParameter"),
        ("clip_param", 148, "?", "ClipParameter"), ("concat_param", 104, "?", "ConcatParameter"),
        ("contrastive_loss_param", 105, "?", "ContrastiveLossParameter"),
        ("convolution_param", 106, "?", "ConvolutionParameter"), ("crop_param", 144, "?", "CropParameter"),
        ("data_param", 107, "?", "DataParameter"), ("dropout_param", 108, "?", "DropoutParameter"),
        ("dummy_data_param", 109, "?", "DummyDataParameter"), ("eltwise_param", 110, "?", "EltwiseParameter"),
        ("elu_param", 140, "?", "ELUParameter"), ("embed_param", 137, "?", "EmbedParameter"),
        ("exp_param", 111, "?", "ExpParameter"), ("flatten_param", 135, "?", "FlattenParameter"),
        ("hdf5_data_param", 112, "?", "HDF5DataParameter"), ("hdf5_output_param", 113, "?", "HDF5OutputParameter"),
        ("hinge_loss_param", 114, "?", "HingeLossParameter"), ("image_data_param", 115, "?", "ImageDataParameter"),
        ("infogain_loss_param", 116, "?", "InfogainLossParameter"),
        ("inner_product_param", 117, "?", "InnerProductParameter"), ("input_param", 143, "?", "InputParameter"),
        ("log_param", 134, "?", "LogParameter"), ("lrn_param", 118, "?", "LRNParameter"),
        ("memory_data_param", 119, "?", "MemoryDataParameter"), ("mvn_param", 120, "?", "MVNParameter"),
        ("parameter_param", 145, "?", "ParameterParameter"), ("pooling_param", 121, "?", "PoolingParameter"),
        ("power_param", 122, "?", "PowerParameter"), ("prelu_param", 131, "?", "PReLUParameter"),
        ("python_param", 130, "?", "PythonParameter"), ("recurrent_param", 146, "?", "RecurrentParameter"),
        ("reduction_param", 136, "?", "ReductionParameter"), ("relu_param", 123, "?", "ReLUParameter"),
        ("reshape_param", 133, "?", "ReshapeParameter"), ("scale_param", 142, "?", "ScaleParameter"),
        ("sigmoid_param", 124, "?", "SigmoidParameter"), ("softmax_param", 125, "?", "SoftmaxParameter"),
        ("spp_param", 132, "?", "SPPParameter"), ("slice_param", 126, "?", "SliceParameter"),
        ("swish_param", 147, "?", "SwishParameter"), ("tanh_param", 127, "?", "TanHParameter"),
        ("threshold_param", 128, "?", "ThresholdParameter"), ("tile_param", 138, "?", "TileParameter"),
        ("window_data_param", 129, "?", "WindowDataParameter"),
    ),
    "TransformationParameter": (
        ("scale", 1, "?", "float", 1.0), ("mirror", 2, "?", "bool", False), ("crop_size", 3, "?", "uint32", 0),
        ("mean_file", 4, "?", "string"), ("mean_value", 5, "*", "float"), ("force_color", 6, "?", "bool", False),
        ("force_gray", 7, "?", "bool", False),
    ),
    "LossParameter": (
        ("ignore_label", 1, "?", "int32"), ("normalization", 3, "?", "NormalizationMode", "VALID"),
        ("normalize", 2, "?", "bool"),
    ),
    "AccuracyParameter": (
        ("top_k", 1, "?", "uint32", 1), ("axis", 2, "?", "int32", 1), ("ignore_label", 3, "?", "int32"),
    ),
    "ArgMaxParameter": (
        ("out_max_val", 1, "?", "bool", False), ("top_k", 2, "?", "uint32", 1), ("axis", 3, "?", "int32"),
    ),
    "ClipParameter": (
        ("min", 1, "!", "float"), ("max", 2, "!", "float"),
    ),
    "ConcatParameter": (
        ("axis", 2, "?", "int32", 1), ("concat_dim", 1, "?", "uint32", 1),
    ),
    "BatchNormParameter": (
        ("use_global_stats", 1, "?", "bool"), ("moving_average_fraction", 2, "?", "float", 0.999),
        ("eps", 3, "?", "float", 1e-05),
    ),
    "BiasParameter": (
        ("axis", 1, "?", "int32", 1), ("num_axes", 2, "?", "int32", 1), ("filler", 3, "?", "FillerParameter"),
    ),
    "ContrastiveLossParameter": (
        ("margin", 1, "?", "float", 1.0), ("legacy_version", 2, "?", "bool", False),
    ),
    "ConvolutionParameter": (
        ("num_output", 1, "?", "uint32"), ("bias_term", 2, "?", "bool", True), ("pad", 3, "*", "uint32"),
        ("kernel_size", 4, "*", "uint32"), ("stride", 6, "*", "uint32"), ("dilation", 18, "*", "uint32"),
        ("pad_h", 9, "?", "uint32", 0), ("pad_w", 10, "?", "uint32", 0), ("kernel_h", 11, "?", "uint32"),
        ("kernel_w", 12, "?", "uint32"), ("stride_h", 13, "?", "uint32"), ("stride_w", 14, "?", "uint32"),
        ("group", 5, "?", "uint32", 1), ("weight_filler", 7, "?", "FillerParameter"),
        ("bias_filler", 8, "?", "FillerParameter"), ("engine", 15, "?", "Engine", "DEFAULT"),
        ("axis", 16, "?", "int32", 1), ("force_nd_im2col", 17, "?", "bool", False),
    ),
    "CropParameter": (
        ("axis", 1, "?", "int32", 2), ("offset", 2, "*", "uint32"),
    ),
    "DataParameter": (
        ("source", 1, "?", "string"), ("batch_size", 4, "?", "uint32"), ("rand_skip", 7, "?", "uint32", 0),
        ("backend", 8, "?", "DB", "LEVELDB"), ("scale", 2, "?", "float", 1.0), ("mean_file", 3, "?", "string"),
        ("crop_size", 5, "?", "uint32", 0), ("mirror", 6, "?", "bool", False),
        ("force_encoded_color", 9, "?", "bool", False), ("prefetch", 10, "?", "uint32", 4),
    ),
    "DropoutParameter": (
        ("dropout_ratio", 1, "?", "float", 0.5),
    ),
    "DummyDataParameter": (
        ("data_filler", 1, "*", "FillerParameter"), ("shape", 6, "*", "BlobShape"), ("num", 2, "*", "uint32"),
        ("channels", 3, "*", "uint32"), ("height", 4, "*", "uint32"), ("width", 5, "*", "uint32"),
    ),
    "EltwiseParameter": (
        ("operation", 1, "?", "EltwiseOp", "SUM"), ("coeff", 2, "*", "float"),
        ("stable_prod_grad", 3, "?", "bool", True),
    ),
    "ELUParameter": (
        ("alpha", 1, "?", "float", 1.0),
    ),
    "EmbedParameter": (
        ("num_output", 1, "?", "uint32"), ("input_dim", 2, "?", "uint32"), ("bias_term", 3, "?", "bool", True),
        ("weight_filler", 4, "?", "FillerParameter"), ("bias_filler", 5, "?", "FillerParameter"),
    ),
    "ExpParameter": (
        ("base", 1, "?", "float", -1.0), ("scale", 2, "?", "float", 1.0), ("shift", 3, "?", "float", 0.0),
    ),
    "FlattenParameter": (
        ("axis", 1, "?", "int32", 1), ("end_axis", 2, "?", "int32", -1),
    ),
    "HDF5DataParameter": (
        ("source", 1, "?", "string"), ("batch_size", 2, "?", "uint32"), ("shuffle", 3, "?", "bool", False),
    ),
    "HDF5OutputParameter": (
        ("file_name", 1, "?", "string"),
    ),
    "HingeLossParameter": (
        ("norm", 1, "?", "Norm", "L1"),
    ),
    "ImageDataParameter": (
        ("source", 1, "?", "string"), ("batch_size", 4, "?", "uint32", 1), ("rand_skip", 7, "?", "uint32", 0),
        ("shuffle", 8, "?", "bool", False), ("new_height", 9, "?", "uint32", 0), ("new_width", 10, "?", "uint32", 0),
        ("is_color", 11, "?", "bool", True), ("scale", 2, "?", "float", 1.0), ("mean_file", 3, "?", "string"),
        ("crop_size", 5, "?", "uint32", 0), ("mirror", 6, "?", "bool", False),
        ("root_folder", 12, "?", "string", ""),
    ),
    "InfogainLossParameter": (
        ("source", 1, "?", "string"), ("axis", 2, "?", "int32", 1),
    ),
    "InnerProductParameter": (
        ("num_output", 1, "?", "uint32"), ("bias_term", 2, "?", "bool", True),
        ("weight_filler", 3, "?", "FillerParameter"), ("bias_filler", 4, "?", "FillerParameter"),
        ("axis", 5, "?", "int32", 1), ("transpose", 6, "?", "bool", False),
    ),
    "InputParameter": (
        ("shape", 1, "*", "BlobShape"),
    ),
    "LogParameter": (
        ("base", 1, "?", "float", -1.0), ("scale", 2, "?", "float", 1.0), ("shift", 3, "?", "float", 0.0),
    ),
    "LRNParameter": (
        ("local_size", 1, "?", "uint32", 5), ("alpha", 2, "?", "float", 1.0), ("beta", 3, "?", "float", 0.75),
        ("norm_region", 4, "?", "NormRegion", "ACROSS_CHANNELS"), ("k", 5, "?", "float", 1.0),
        ("engine", 6, "?", "Engine", "DEFAULT"),
    ),
    "MemoryDataParameter": (
        ("batch_size", 1, "?", "uint32"), ("channels", 2, "?", "uint32"), ("height", 3, "?", "uint32"),
        ("width", 4, "?", "uint32"),
    ),
    "MVNParameter": (
        ("normalize_variance", 1, "?", "bool", True), ("across_channels", 2, "?", "bool", False),
        ("eps", 3, "?", "float", 1e-09),
    ),
    "ParameterParameter": (
        ("shape", 1, "?", "BlobShape"),
    ),
    "PoolingParameter": (
        ("pool", 1, "?", "PoolMethod", "MAX"), ("pad", 4, "?", "uint32", 0), ("pad_h", 9, "?", "uint32", 0),
        ("pad_w", 10, "?", "uint32", 0), ("kernel_size", 2, "?", "uint32"), ("kernel_h", 5, "?", "uint32"),
        ("kernel_w", 6, "?", "uint32"), ("stride", 3, "?", "uint32", 1), ("stride_h", 7, "?", "uint32"),
        ("stride_w", 8, "?", "uint32"), ("engine", 11, "?", "Engine", "DEFAULT"),
        ("global_pooling", 12, "?", "bool", False), ("round_mode", 13, "?", "RoundMode", "CEIL"),
    ),
    "PowerParameter": (
        ("power", 1, "?", "float", 1.0), ("scale", 2, "?", "float", 1.0), ("shift", 3, "?", "float", 0.0),
    ),
    "PythonParameter": (
        ("module", 1, "?", "string"), ("layer", 2, "?", "string"), ("param_str", 3, "?", "string", ""),
        ("share_in_parallel", 4, "?", "bool", False),
    ),
    "RecurrentParameter": (
        ("num_output", 1, "?", "uint32", 0), ("weight_filler", 2, "?", "FillerParameter"),
        ("bias_filler", 3, "?", "FillerParameter"), ("debug_info", 4, "?", "bool", False),
        ("expose_hidden", 5, "?", "bool", False),
    ),
    "ReductionParameter": (
        ("operation", 1, "?", "ReductionOp", "SUM"), ("axis", 2, "?", "int32", 0), ("coeff", 3, "?", "float", 1.0),
    ),
    "ReLUParameter": (
        ("negative_slope", 1, "?", "float", 0.0), ("engine", 2, "?", "Engine", "DEFAULT"),
    ),
    "ReshapeParameter": (
        ("shape", 1, "?", "BlobShape"), ("axis", 2, "?", "int32", 0), ("num_axes", 3, "?", "int32", -1),
    ),
    "ScaleParameter": (
        ("axis", 1, "?", "int32", 1), ("num_axes", 2, "?", "int32", 1), ("filler", 3, "?", "FillerParameter"),
        ("bias_term", 4, "?", "bool", False), ("bias_filler", 5, "?", "FillerParameter"),
    ),
    "SigmoidParameter": (
        ("engine", 1, "?", "Engine", "DEFAULT"),
    ),
    "SliceParameter": (
        ("axis", 3, "?", "int32", 1), ("slice_point", 2, "*", "uint32"), ("slice_dim", 1, "?", "uint32", 1),
    ),
    "SoftmaxParameter": (
        ("engine", 1, "?", "Engine", "DEFAULT"), ("axis", 2, "?", "int32", 1),
    ),
    "SwishParameter": (
        ("beta", 1, "?", "float", 1.0),
    ),
    "TanHParameter": (
        ("engine", 1, "?", "Engine", "DEFAULT"),
    ),
    "TileParameter": (
        ("axis", 1, "?", "int32", 1), ("tiles", 2, "?", "int32"),
    ),
    "ThresholdParameter": (
        ("threshold", 1, "?", "float", 0.0),
    ),
    "WindowDataParameter": (
        ("source", 1, "?", "string"), ("scale", 2, "?", "float", 1.0), ("mean_file", 3, "?", "string"),
        ("batch_size", 4, "?", "uint32"), ("crop_size", 5, "?", "uint32", 0), ("mirror", 6, "?", "bool", False),
        ("fg_threshold", 7, "?", "float", 0.5), ("bg_threshold", 8, "?", "float", 0.5),
        ("fg_fraction", 9, "?", "float", 0.25), ("context_pad", 10, "?", "uint32", 0),
        ("crop_mode", 11, "?", "string", "warp"), ("cache_images", 12, "?", "bool", False),
        ("root_folder", 13, "?", "string", ""),
    ),
    "SPPParameter": (
        ("pyramid_height", 1, "?", "uint32"), ("pool", 2, "?", "PoolMethod", "MAX"),
        ("engine", 6, "?", "Engine", "DEFAULT"),
    ),
    "V1LayerParameter": (
        ("bottom", 2, "*", "string"), ("top", 3, "*", "string"), ("name", 4, "?", "string"),
        ("include", 32, "*", "NetStateRule"), ("exclude", 33, "*", "NetStateRule"), ("type", 5, "?", "LayerType"),
        ("blobs", 6, "*", "BlobProto"), ("param", 1001, "*", "string"),
        ("blob_share_mode", 1002, "*", "DimCheckMode"), ("blobs_lr", 7, "*", "float"),
        ("weight_decay", 8, "*", "float"), ("loss_weight", 35, "*", "float"),
        ("accuracy_param", 27, "?", "AccuracyParameter"), ("argmax_param", 23, "?", "ArgMaxParameter"),
        ("concat_param", 9, "?", "ConcatParameter"), ("contrastive_loss_param", 40, "?", "ContrastiveLossParameter"),
        ("convolution_param", 10, "?", "ConvolutionParameter"), ("data_param", 11, "?", "DataParameter"),
        ("dropout_param", 12, "?", "DropoutParameter"), ("dummy_data_param", 26, "?", "DummyDataParameter"),
        ("eltwise_param", 24, "?", "EltwiseParameter"), ("exp_param", 41, "?", "ExpParameter"),
        ("hdf5_data_param", 13, "?", "HDF5DataParameter"), ("hdf5_output_param", 14, "?", "HDF5OutputParameter"),
        ("hinge_loss_param", 29, "?", "HingeLossParameter"), ("image_data_param", 15, "?", "ImageDataParameter"),
        ("infogain_loss_param", 16, "?", "InfogainLossParameter"),
        ("inner_product_param", 17, "?", "InnerProductParameter"), ("lrn_param", 18, "?", "LRNParameter"),
        ("memory_data_param", 22, "?", "MemoryDataParameter"), ("mvn_param", 34, "?", "MVNParameter"),
        ("pooling_param", 19, "?", "PoolingParameter"), ("power_param", 21, "?", "PowerParameter"),
        ("relu_param", 30, "?", "ReLUParameter"), ("sigmoid_param", 38, "?", "SigmoidParameter"),
        ("softmax_param", 39, "?", "SoftmaxParameter"), ("slice_param", 31, "?", "SliceParameter"),
        ("tanh_param", 37, "?", "TanHParameter"), ("threshold_param", 25, "?", "ThresholdParameter"),
        ("window_data_param", 20, "?", "WindowDataParameter"),
        ("transform_param", 36, "?", "TransformationParameter"), ("loss_param", 42, "?", "LossParameter"),
        ("layer", 1, "?", "V0LayerParameter"),
    ),
    "V0LayerParameter": (
        ("name", 1, "?", "string"), ("type", 2, "?", "string"), ("num_output", 3, "?", "uint32"),
        ("biasterm", 4, "?", "bool", True), ("weight_filler", 5, "?", "FillerParameter"),
        ("bias_filler", 6, "?", "FillerParameter"), ("pad", 7, "?", "uint32", 0), ("kernelsize", 8, "?", "uint32"),
        ("group", 9, "?", "uint32", 1), ("stride", 10, "?", "uint32", 1), ("pool", 11, "?", "PoolMethod", "MAX"),
        ("dropout_ratio", 12, "?", "float", 0.5), ("local_size", 13, "?", "uint32", 5),
        ("alpha", 14, "?", "float", 1.0), ("beta", 15, "?", "float", 0.75), ("k", 22, "?", "float", 1.0),
        ("source", 16, "?", "string"), ("scale", 17, "?", "float", 1.0), ("meanfile", 18, "?", "string"),
        ("batchsize", 19, "?", "uint32"), ("cropsize", 20, "?", "uint32", 0), ("mirror", 21, "?", "bool", False),
        ("blobs", 50, "*", "BlobProto"), ("blobs_lr", 51, "*", "float"), ("weight_decay", 52, "*", "float"),
        ("rand_skip", 53, "?", "uint32", 0), ("det_fg_threshold", 54, "?", "float", 0.5),
        ("det_bg_threshold", 55, "?", "float", 0.5), ("det_fg_fraction", 56, "?", "float", 0.25),
        ("det_context_pad", 58, "?", "uint32", 0), ("det_crop_mode", 59, "?", "string", "warp"),
        ("new_num", 60, "?", "int32", 0), ("new_channels", 61, "?", "int32", 0), ("new_height", 62, "?", "int32", 0),
        ("new_width", 63, "?", "int32", 0), ("shuffle_images", 64, "?", "bool", False),
        ("concat_dim", 65, "?", "uint32", 1), ("hdf5_output_param", 1001, "?", "HDF5OutputParameter"),
    ),
    "PReLUParameter": (
        ("filler", 1, "?", "FillerParameter"), ("channel_shared", 2, "?", "bool", False),
    ),
}

# ---------------------------------------------------------------------------------------------
# Caffe's forks: what each adds to BVLC's caffe.proto (transcribed from the fork's own caffe.proto)

FORKS = {
    "ssd": "weiliu89/caffe (branch ssd: SSD)",
    "fast-rcnn": "rbgirshick/caffe-fast-rcnn (Fast/Faster R-CNN)",
    "segnet": "alexgkendall/caffe-segnet (SegNet)",
    "enet": "TimoSaemann/caffe-enet (ENet)",
    "opencv": "OpenCV's caffe.proto (opencv/opencv, modules/dnn)",
    "openpose": "CMU-Perceptual-Computing-Lab/caffe_train (OpenPose training)",
}

# the layer types each fork registers beyond BVLC's (its REGISTER_LAYER_CLASS lines)
FORK_LAYER_TYPES = {
    "ssd": ("AnnotatedData", "DetectionEvaluate", "DetectionOutput", "MultiBoxLoss", "Normalize", "Permute",
            "PriorBox", "SmoothL1Loss", "VideoData"),
    "fast-rcnn": ("ROIPooling", "SmoothL1Loss"),
    "segnet": ("BN", "DenseImageData", "Upsample"),
    "enet": ("BN", "DenseImageData", "Upsample"),
    "openpose": ("CPMData",),
}

FORK_ENUMS = {
    "ssd": {
        "EmitConstraint.EmitType": (("CENTER", 0), ("MIN_OVERLAP", 1)),
        "AnnotatedDatum.AnnotationType": (("BBOX", 0),),
        "ResizeParameter.Resize_mode": (("WARP", 1), ("FIT_SMALL_SIZE", 2), ("FIT_LARGE_SIZE_AND_PAD", 3)),
        "ResizeParameter.Pad_mode": (("CONSTANT", 1), ("MIRRORED", 2), ("REPEAT_NEAREST", 3)),
        "ResizeParameter.Interp_mode": (("LINEAR", 1), ("AREA", 2), ("NEAREST", 3), ("CUBIC", 4), ("LANCZOS4", 5)),
        "MultiBoxLossParameter.LocLossType": (("L2", 0), ("SMOOTH_L1", 1)),
        "MultiBoxLossParameter.ConfLossType": (("SOFTMAX", 0), ("LOGISTIC", 1)),
        "MultiBoxLossParameter.MatchType": (("BIPARTITE", 0), ("PER_PREDICTION", 1)),
        "MultiBoxLossParameter.MiningType": (("NONE", 0), ("MAX_NEGATIVE", 1), ("HARD_EXAMPLE", 2)),
        "PriorBoxParameter.CodeType": (("CORNER", 1), ("CENTER_SIZE", 2), ("CORNER_SIZE", 3)),
        "VideoDataParameter.VideoType": (("WEBCAM", 0), ("VIDEO", 1)),
    },
    "segnet": {"BNParameter.BNMode": (("LEARN", 0), ("INFERENCE", 1))},
    "enet": {"BNParameter.BNMode": (("LEARN", 0), ("INFERENCE", 1))},
}

_DENSE_IMAGE_DATA = (
    ("source", 1, "?", "string"), ("batch_size", 2, "?", "uint32"), ("rand_skip", 3, "?", "uint32", 0),
    ("shuffle", 4, "?", "bool", False), ("new_height", 5, "?", "uint32", 0), ("new_width", 6, "?", "uint32", 0),
    ("is_color", 7, "?", "bool", True), ("mean_file", 8, "?", "string"), ("root_folder", 9, "?", "string", ""),
    ("mirror", 10, "?", "bool", False), ("crop_width", 11, "?", "uint32", 0), ("crop_height", 12, "?", "uint32", 0),
)
_BN = (
    ("bn_mode", 3, "?", "BNMode", "LEARN"), ("scale_filler", 1, "?", "FillerParameter"),
    ("shift_filler", 2, "?", "FillerParameter"),
)
_UPSAMPLE = (
    ("scale", 1, "?", "uint32", 2), ("scale_h", 2, "?", "uint32"), ("scale_w", 3, "?", "uint32"),
    ("pad_out_h", 4, "?", "bool", False), ("pad_out_w", 5, "?", "bool", False), ("upsample_h", 6, "?", "uint32"),
    ("upsample_w", 7, "?", "uint32"),
)

FORK_MESSAGES = {
    "ssd": {
        "LabelMapItem": (
            ("name", 1, "?", "string"), ("label", 2, "?", "int32"), ("display_name", 3, "?", "string"),
        ),
        "LabelMap": (
            ("item", 1, "*", "LabelMapItem"),
        ),
        "Sampler": (
            ("min_scale", 1, "?", "float", 1.0), ("max_scale", 2, "?", "float", 1.0),
            ("min_aspect_ratio", 3, "?", "float", 1.0), ("max_aspect_ratio", 4, "?", "float", 1.0),
        ),
        "SampleConstraint": (
            ("min_jaccard_overlap", 1, "?", "float"), ("max_jaccard_overlap", 2, "?", "float"),
            ("min_sample_coverage", 3, "?", "float"), ("max_sample_coverage", 4, "?", "float"),
            ("min_object_coverage", 5, "?", "float"), ("max_object_coverage", 6, "?", "float"),
        ),
        "BatchSampler": (
            ("use_original_image", 1, "?", "bool", True), ("sampler", 2, "?", "Sampler"),
            ("sample_constraint", 3, "?", "SampleConstraint"), ("max_sample", 4, "?", "uint32"),
            ("max_trials", 5, "?", "uint32", 100),
        ),
        "EmitConstraint": (
            ("emit_type", 1, "?", "EmitType", "CENTER"), ("emit_overlap", 2, "?", "float"),
        ),
        "NormalizedBBox": (
            ("xmin", 1, "?", "float"), ("ymin", 2, "?", "float"), ("xmax", 3, "?", "float"), ("ymax", 4, "?", "float"),
            ("label", 5, "?", "int32"), ("difficult", 6, "?", "bool"), ("score", 7, "?", "float"),
            ("size", 8, "?", "float"),
        ),
        "Annotation": (
            ("instance_id", 1, "?", "int32", 0), ("bbox", 2, "?", "NormalizedBBox"),
        ),
        "AnnotationGroup": (
            ("group_label", 1, "?", "int32"), ("annotation", 2, "*", "Annotation"),
        ),
        "AnnotatedDatum": (
            ("datum", 1, "?", "Datum"), ("type", 2, "?", "AnnotationType"),
            ("annotation_group", 3, "*", "AnnotationGroup"),
        ),
        "ResizeParameter": (
            ("prob", 1, "?", "float", 1.0), ("resize_mode", 2, "?", "Resize_mode", "WARP"),
            ("height", 3, "?", "uint32", 0), ("width", 4, "?", "uint32", 0), ("height_scale", 8, "?", "uint32", 0),
            ("width_scale", 9, "?", "uint32", 0), ("pad_mode", 5, "?", "Pad_mode", "CONSTANT"),
            ("pad_value", 6, "*", "float"), ("interp_mode", 7, "*", "Interp_mode"),
        ),
        "SaltPepperParameter": (
            ("fraction", 1, "?", "float", 0.0), ("value", 2, "*", "float"),
        ),
        "NoiseParameter": (
            ("prob", 1, "?", "float", 0.0), ("hist_eq", 2, "?", "bool", False), ("inverse", 3, "?", "bool", False),
            ("decolorize", 4, "?", "bool", False), ("gauss_blur", 5, "?", "bool", False),
            ("jpeg", 6, "?", "float", -1.0), ("posterize", 7, "?", "bool", False), ("erode", 8, "?", "bool", False),
            ("saltpepper", 9, "?", "bool", False), ("saltpepper_param", 10, "?", "SaltPepperParameter"),
            ("clahe", 11, "?", "bool", False), ("convert_to_hsv", 12, "?", "bool", False),
            ("convert_to_lab", 13, "?", "bool", False),
        ),
        "DistortionParameter": (
            ("brightness_prob", 1, "?", "float", 0.0), ("brightness_delta", 2, "?", "float", 0.0),
            ("contrast_prob", 3, "?", "float", 0.0), ("contrast_lower", 4, "?", "float", 0.0),
            ("contrast_upper", 5, "?", "float", 0.0), ("hue_prob", 6, "?", "float", 0.0),
            ("hue_delta", 7, "?", "float", 0.0), ("saturation_prob", 8, "?", "float", 0.0),
            ("saturation_lower", 9, "?", "float", 0.0), ("saturation_upper", 10, "?", "float", 0.0),
            ("random_order_prob", 11, "?", "float", 0.0),
        ),
        "ExpansionParameter": (
            ("prob", 1, "?", "float", 1.0), ("max_expand_ratio", 2, "?", "float", 1.0),
        ),
        "AnnotatedDataParameter": (
            ("batch_sampler", 1, "*", "BatchSampler"), ("label_map_file", 2, "?", "string"),
            ("anno_type", 3, "?", "AnnotatedDatum.AnnotationType"),
        ),
        "DetectionEvaluateParameter": (
            ("num_classes", 1, "?", "uint32"), ("background_label_id", 2, "?", "uint32", 0),
            ("overlap_threshold", 3, "?", "float", 0.5), ("evaluate_difficult_gt", 4, "?", "bool", True),
            ("name_size_file", 5, "?", "string"), ("resize_param", 6, "?", "ResizeParameter"),
        ),
        "NonMaximumSuppressionParameter": (
            ("nms_threshold", 1, "?", "float", 0.3), ("top_k", 2, "?", "int32"), ("eta", 3, "?", "float", 1.0),
        ),
        "SaveOutputParameter": (
            ("output_directory", 1, "?", "string"), ("output_name_prefix", 2, "?", "string"),
            ("output_format", 3, "?", "string"), ("label_map_file", 4, "?", "string"),
            ("name_size_file", 5, "?", "string"), ("num_test_image", 6, "?", "uint32"),
            ("resize_param", 7, "?", "ResizeParameter"),
        ),
        "DetectionOutputParameter": (
            ("num_classes", 1, "?", "uint32"), ("share_location", 2, "?", "bool", True),
            ("background_label_id", 3, "?", "int32", 0), ("nms_param", 4, "?", "NonMaximumSuppressionParameter"),
            ("save_output_param", 5, "?", "SaveOutputParameter"),
            ("code_type", 6, "?", "PriorBoxParameter.CodeType", "CORNER"),
            ("variance_encoded_in_target", 8, "?", "bool", False), ("keep_top_k", 7, "?", "int32", -1),
            ("confidence_threshold", 9, "?", "float"), ("visualize", 10, "?", "bool", False),
            ("visualize_threshold", 11, "?", "float"), ("save_file", 12, "?", "string"),
        ),
        "MultiBoxLossParameter": (
            ("loc_loss_type", 1, "?", "LocLossType", "SMOOTH_L1"), ("conf_loss_type", 2, "?", "ConfLossType", "SOFTMAX"),
            ("loc_weight", 3, "?", "float", 1.0), ("num_classes", 4, "?", "uint32"),
            ("share_location", 5, "?", "bool", True), ("match_type", 6, "?", "MatchType", "PER_PREDICTION"),
            ("overlap_threshold", 7, "?", "float", 0.5), ("use_prior_for_matching", 8, "?", "bool", True),
            ("background_label_id", 9, "?", "uint32", 0), ("use_difficult_gt", 10, "?", "bool", True),
            ("do_neg_mining", 11, "?", "bool"), ("neg_pos_ratio", 12, "?", "float", 3.0),
            ("neg_overlap", 13, "?", "float", 0.5), ("code_type", 14, "?", "PriorBoxParameter.CodeType", "CORNER"),
            ("encode_variance_in_target", 16, "?", "bool", False), ("map_object_to_agnostic", 17, "?", "bool", False),
            ("ignore_cross_boundary_bbox", 18, "?", "bool", False), ("bp_inside", 19, "?", "bool", False),
            ("mining_type", 20, "?", "MiningType", "MAX_NEGATIVE"),
            ("nms_param", 21, "?", "NonMaximumSuppressionParameter"), ("sample_size", 22, "?", "int32", 64),
            ("use_prior_for_nms", 23, "?", "bool", False),
        ),
        "NormalizeParameter": (
            ("across_spatial", 1, "?", "bool", True), ("scale_filler", 2, "?", "FillerParameter"),
            ("channel_shared", 3, "?", "bool", True), ("eps", 4, "?", "float", 1e-10),
        ),
        "PermuteParameter": (
            ("order", 1, "*", "uint32"),
        ),
        "PriorBoxParameter": (
            ("min_size", 1, "*", "float"), ("max_size", 2, "*", "float"), ("aspect_ratio", 3, "*", "float"),
            ("flip", 4, "?", "bool", True), ("clip", 5, "?", "bool", False), ("variance", 6, "*", "float"),
            ("img_size", 7, "?", "uint32"), ("img_h", 8, "?", "uint32"), ("img_w", 9, "?", "uint32"),
            ("step", 10, "?", "float"), ("step_h", 11, "?", "float"), ("step_w", 12, "?", "float"),
            ("offset", 13, "?", "float", 0.5),
        ),
        "VideoDataParameter": (
            ("video_type", 1, "?", "VideoType", "WEBCAM"), ("device_id", 2, "?", "int32", 0),
            ("video_file", 3, "?", "string"), ("skip_frames", 4, "?", "uint32", 0),
        ),
    },
    "fast-rcnn": {
        "ROIPoolingParameter": (
            ("pooled_h", 1, "?", "uint32", 0), ("pooled_w", 2, "?", "uint32", 0), ("spatial_scale", 3, "?", "float", 1.0),
        ),
        "SmoothL1LossParameter": (
            ("sigma", 1, "?", "float", 1.0),
        ),
    },
    "segnet": {"BNParameter": _BN, "UpsampleParameter": _UPSAMPLE, "DenseImageDataParameter": _DENSE_IMAGE_DATA},
    "openpose": {
        "CPMTransformationParameter": (
            ("scale", 1, "?", "float", 1.0), ("mirror", 2, "?", "bool", False), ("crop_size", 3, "?", "uint32", 0),
            ("mean_file", 4, "?", "string"), ("mean_value", 5, "*", "float"), ("stride", 6, "?", "uint32", 4),
            ("scale_cvg", 7, "?", "float", 0.5), ("max_cvg_len", 8, "?", "uint32", 50),
            ("min_cvg_len", 9, "?", "uint32", 50), ("opaque_coverage", 10, "?", "bool", True),
            ("coverage", 11, "?", "string", "gridbox_max"), ("flip_prob", 12, "?", "float", 0.5),
            ("max_rotate_degree", 13, "?", "float", 5.0), ("visualize", 14, "?", "bool", False),
            ("crop_size_x", 15, "?", "uint32", 368), ("crop_size_y", 16, "?", "uint32", 368),
            ("scale_prob", 17, "?", "float", 0.5), ("scale_min", 18, "?", "float", 0.9),
            ("scale_max", 19, "?", "float", 1.1), ("bbox_norm_factor", 20, "?", "float", 300.0),
            ("img_header", 21, "?", "string", "."), ("force_color", 22, "?", "bool", False),
            ("force_gray", 23, "?", "bool", False), ("target_dist", 24, "?", "float", 1.0),
            ("center_perterb_max", 25, "?", "float", 10.0), ("sigma", 26, "?", "float", 7.0),
            ("sigma_center", 27, "?", "float", 21.0), ("clahe_tile_size", 28, "?", "float", 8.0),
            ("clahe_clip_limit", 29, "?", "float", 4.0), ("do_clahe", 30, "?", "bool", False),
            ("num_parts", 31, "?", "uint32", 14), ("num_total_augs", 32, "?", "uint32", 82),
            ("aug_way", 33, "?", "string", "rand"), ("gray", 34, "?", "uint32", 0),
            ("np_in_lmdb", 35, "?", "uint32", 16), ("transform_body_joint", 38, "?", "bool", True),
        ),
    },
    "enet": {"BNParameter": _BN, "UpsampleParameter": _UPSAMPLE,
             "DenseImageDataParameter": _DENSE_IMAGE_DATA + (("label_divide_factor", 13, "?", "uint32", 1),)},
}

# fields a fork adds to messages of BVLC's
FORK_FIELDS = {
    "ssd": {
        "LayerParameter": (
            ("annotated_data_param", 200, "?", "AnnotatedDataParameter"),
            ("multibox_loss_param", 201, "?", "MultiBoxLossParameter"),
            ("permute_param", 202, "?", "PermuteParameter"), ("prior_box_param", 203, "?", "PriorBoxParameter"),
            ("detection_output_param", 204, "?", "DetectionOutputParameter"),
            ("detection_evaluate_param", 205, "?", "DetectionEvaluateParameter"),
            ("norm_param", 206, "?", "NormalizeParameter"), ("video_data_param", 207, "?", "VideoDataParameter"),
        ),
        "TransformationParameter": (
            ("crop_h", 11, "?", "uint32", 0), ("crop_w", 12, "?", "uint32", 0),
            ("resize_param", 8, "?", "ResizeParameter"), ("noise_param", 9, "?", "NoiseParameter"),
            ("distort_param", 13, "?", "DistortionParameter"), ("expand_param", 14, "?", "ExpansionParameter"),
            ("emit_constraint", 10, "?", "EmitConstraint"),
        ),
        "SolverParameter": (
            ("eval_type", 41, "?", "string", "classification"), ("ap_version", 42, "?", "string", "Integral"),
            ("show_per_class_result", 44, "?", "bool", False), ("plateau_winsize", 43, "*", "int32"),
        ),
        "SolverState": (
            ("minimum_loss", 5, "?", "float", 1e38), ("iter_last_event", 6, "?", "int32", 0),
        ),
    },
    "fast-rcnn": {
        "LayerParameter": (
            ("roi_pooling_param", 8266711, "?", "ROIPoolingParameter"),
            ("smooth_l1_loss_param", 8266712, "?", "SmoothL1LossParameter"),
        ),
        "DropoutParameter": (
            ("scale_train", 2, "?", "bool", True),
        ),
    },
    "segnet": {
        "LayerParameter": (
            ("bn_param", 45, "?", "BNParameter"), ("dense_image_data_param", 138, "?", "DenseImageDataParameter"),
            ("upsample_param", 137, "?", "UpsampleParameter"),
        ),
        "LossParameter": (
            ("weight_by_label_freqs", 3, "?", "bool", False), ("class_weighting", 4, "*", "float"),
        ),
        "DropoutParameter": (
            ("sample_weights_test", 2, "?", "bool", False),
        ),
    },
    "enet": {
        "LayerParameter": (
            ("upsample_param", 147, "?", "UpsampleParameter"), ("bn_param", 45, "?", "BNParameter"),
            ("dense_image_data_param", 46, "?", "DenseImageDataParameter"),
        ),
        "LossParameter": (
            ("normalization", 5, "?", "NormalizationMode", "VALID"), ("weight_by_label_freqs", 3, "?", "bool", False),
            ("class_weighting", 4, "*", "float"),
        ),
        "DropoutParameter": (
            ("sample_weights_test", 2, "?", "bool", False),
        ),
        "ImageDataParameter": (
            ("label_divide_factor", 13, "?", "uint32", 1),
        ),
    },
    "openpose": {
        "LayerParameter": (
            ("cpm_transform_param", 147, "?", "CPMTransformationParameter"),
        ),
    },
    "opencv": {
        "PriorBoxParameter": (
            ("offset_h", 14, "*", "float"), ("offset_w", 15, "*", "float"), ("width", 16, "*", "float"),
            ("height", 17, "*", "float"),
        ),
        "DetectionOutputParameter": (
            ("normalized_bbox", 10, "?", "bool", True), ("clip", 1000, "?", "bool", False),
        ),
        "BatchNormParameter": (
            ("scale_bias", 7, "?", "bool", False),
        ),
    },
}

CLASHES = []   # (fork, message, field tuple, what it clashes with): fork fields left out of the table


def _merge_fork_fields(fork, message, fields):
    """Add a fork's ``fields`` to ``MESSAGES[message]``: the same definition again is kept once; a name or number
    that is already another field's is a clash (left out, recorded in CLASHES)."""
    present = MESSAGES[message]
    by_name = {f[0]: f for f in present}
    by_number = {f[1]: f for f in present}
    added = []
    for field in fields:
        same = by_name.get(field[0])
        if same is not None and same[1:4] == field[1:4]:
            continue
        other = same or by_number.get(field[1])
        if other is not None:
            CLASHES.append((fork, message, field, other))
            continue
        added.append(field)
        by_name[field[0]], by_number[field[1]] = field, field
    MESSAGES[message] = present + tuple(added)


def _merge_forks():
    for fork in FORKS:
        for name, values in FORK_ENUMS.get(fork, {}).items():
            if ENUMS.setdefault(name, values) != values:
                raise AssertionError(f"caffe_pb: enum {name} of {fork} differs from the table's")
        for name, fields in FORK_MESSAGES.get(fork, {}).items():
            MESSAGES.setdefault(name, ())
            _merge_fork_fields(fork, name, fields)
        for name, fields in FORK_FIELDS.get(fork, {}).items():
            _merge_fork_fields(fork, name, fields)


_merge_forks()


def fork_names(forks):
    """``["segnet", "enet"]`` -> ``"alexgkendall/caffe-segnet (SegNet) and TimoSaemann/caffe-enet (ENet)"``."""
    return " and ".join(FORKS[f] for f in forks)


def forks_of_layer_type(layer_type):
    """The forks (``FORKS`` keys) that register layer type ``layer_type``, in ``FORKS`` order."""
    return [f for f in FORKS if layer_type in FORK_LAYER_TYPES.get(f, ())]


def field_type(message, field):
    """The message type name of ``message``'s ``field`` (``"LayerParameter"``, ``"norm_param"`` ->
    ``"NormalizeParameter"``), a fork's field left out by a clash included; None for a scalar or unknown field."""
    descriptor = POOL.FindMessageTypeByName(f"{PACKAGE}.{message}") if message in MESSAGES else None
    found = descriptor.fields_by_name.get(field) if descriptor is not None else None
    if found is not None:
        return found.message_type.name if found.message_type is not None else None
    for fork in FORKS:
        for f in FORK_FIELDS.get(fork, {}).get(message, ()) + FORK_MESSAGES.get(fork, {}).get(message, ()):
            if f[0] == field and f[3] in MESSAGES:
                return f[3]
    return None


def fork_of(message, field=None):
    """The forks (``FORKS`` keys) whose caffe.proto defines ``message`` (``field`` None) or its ``field``, in
    ``FORKS`` order: ``fork_of("LayerParameter", "norm_param") == ["ssd"]``; an empty list for BVLC's own."""
    found = []
    for fork in FORKS:
        if field is None:
            defined = message in FORK_MESSAGES.get(fork, {}) or message in FORK_ENUMS.get(fork, {})
        else:
            fields = FORK_MESSAGES.get(fork, {}).get(message, ()) + FORK_FIELDS.get(fork, {}).get(message, ())
            defined = any(f[0] == field for f in fields)
        if defined:
            found.append(fork)
    return found


_SCALARS = {
    "double": "TYPE_DOUBLE", "float": "TYPE_FLOAT", "int64": "TYPE_INT64", "uint64": "TYPE_UINT64",
    "int32": "TYPE_INT32", "uint32": "TYPE_UINT32", "bool": "TYPE_BOOL", "string": "TYPE_STRING",
    "bytes": "TYPE_BYTES",
}
_LABELS = {"?": "LABEL_OPTIONAL", "!": "LABEL_REQUIRED", "*": "LABEL_REPEATED", "*p": "LABEL_REPEATED"}


def _resolve(scope, name):
    """The full name (``.caffe.X.Y``) and kind of type ``name`` used inside message ``scope``."""
    for candidate in (f"{scope}.{name}", name):
        if candidate in ENUMS:
            return "." + PACKAGE + "." + candidate, "TYPE_ENUM"
        if candidate in MESSAGES:
            return "." + PACKAGE + "." + candidate, "TYPE_MESSAGE"
    raise KeyError(f"caffe_pb: type '{name}' used in {scope} is not in the table")


def _default_text(value):
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _add_enum(container, name, values):
    enum = container.enum_type.add(name=name)
    for value_name, number in values:
        enum.value.add(name=value_name, number=number)


def _file_descriptor():
    fdp = descriptor_pb2.FileDescriptorProto(name="caffe.proto", package=PACKAGE, syntax="proto2")
    F = descriptor_pb2.FieldDescriptorProto
    for name, values in ENUMS.items():
        if "." not in name:
            _add_enum(fdp, name, values)
    for name, fields in MESSAGES.items():
        msg = fdp.message_type.add(name=name)
        for enum_name, values in ENUMS.items():
            if enum_name.startswith(name + ".") and "." not in enum_name[len(name) + 1:]:
                _add_enum(msg, enum_name[len(name) + 1:], values)
        for field_name, number, label, type_name, *default in fields:
            f = msg.field.add(name=field_name, number=number, label=getattr(F, _LABELS[label]))
            if type_name in _SCALARS:
                f.type = getattr(F, _SCALARS[type_name])
            else:
                full, kind = _resolve(name, type_name)
                f.type, f.type_name = getattr(F, kind), full
            if default:
                f.default_value = _default_text(default[0])
            if label == "*p":
                f.options.packed = True
    return fdp


POOL = descriptor_pool.DescriptorPool()
DESCRIPTOR = POOL.Add(_file_descriptor())
# the classes, under their Caffe names: globals() so `from layerforge.caffe.caffe_pb import Datum` works
for _name in MESSAGES:
    globals()[_name] = message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{PACKAGE}.{_name}"))
for _name, _values in ENUMS.items():
    if "." not in _name:
        globals()[_name] = EnumTypeWrapper(POOL.FindEnumTypeByName(f"{PACKAGE}.{_name}"))
        globals().update(_values)
del _name, _values

__all__ = list(MESSAGES) + [n for n in ENUMS if "." not in n] + \
    [v for n, vs in ENUMS.items() if "." not in n for v, _ in vs]
