"""What each of Caffe's 8 example notebooks (and the SSD fork's, from a checkout of its ``ssd`` branch) needs to run
here: its offline substitutes and its listed edits.

Used by notebooks.py (the runner). Every edit is (old text, new text, reason); reasons as in notebooks.py's
docstring (py3, offline, cpu, library). Substitutes are made under the Caffe root before the notebook runs, at the
paths Caffe's download scripts would fill.
"""
import os
import sys

import numpy

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # layerforge's tests/
GPU_LINES = ("caffe.set_mode_gpu()", "caffe.set_mode_cpu()  # cpu: no device here")


def has_gpu():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, no driver
        return False


# ---------------------------------------------------------------------------------------------------------------
# substitutes for downloads

_WRITTEN = {}  # (root, deploy, train, seed) -> the caffemodel written for them, which the same arguments copy


def random_caffemodel(root, deploy, weights, train=None, seed=0):
    """A caffemodel of random weights for the net ``deploy`` (paths under ``root``), written by layerforge: each layer
    initialised by the fillers its training net ``train`` gives it (Caffe's own start of training), or by
    N(0, 0.01^2) weights and zero biases where that net has no such layer. The same net, fillers and seed give the
    same weights: a second file of them is a copy of the first (SSD300's three take seconds each to fill)."""
    import shutil

    from google.protobuf import text_format

    import layerforge.pycaffe as caffe
    from layerforge.pycaffe.proto import caffe_pb2

    path = os.path.join(root, weights)
    if os.path.exists(path):
        return path
    key = (root, deploy, train, seed)
    if os.path.exists(_WRITTEN.get(key, "")):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(_WRITTEN[key], path)
        return path
    net_param = caffe_pb2.NetParameter()
    with open(os.path.join(root, deploy)) as f:
        text_format.Merge(f.read(), net_param)
    sources = {}
    if train is not None:
        train_param = caffe_pb2.NetParameter()
        with open(os.path.join(root, train)) as f:
            text_format.Merge(f.read(), train_param)
        sources = {layer.name: layer for layer in train_param.layer}
    for layer in net_param.layer:
        for block in ("convolution_param", "inner_product_param"):
            if not layer.HasField(block):
                continue
            mine, theirs = getattr(layer, block), getattr(sources.get(layer.name, layer), block, None)
            if theirs is not None and theirs.HasField("weight_filler") and theirs is not mine:
                mine.weight_filler.CopyFrom(theirs.weight_filler)
                mine.bias_filler.CopyFrom(theirs.bias_filler)
            elif not mine.HasField("weight_filler"):
                mine.weight_filler.type, mine.weight_filler.std = "gaussian", 0.01
    filled = path + ".prototxt"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(filled, "w") as f:
        f.write(text_format.MessageToString(net_param))
    caffe.set_random_seed(seed)
    caffe.Net(filled, caffe.TEST).save(path)
    os.remove(filled)
    _WRITTEN[key] = path
    return path


def caffenet_weights(root):
    return random_caffemodel(root, "models/bvlc_reference_caffenet/deploy.prototxt",
                             "models/bvlc_reference_caffenet/bvlc_reference_caffenet.caffemodel",
                             "models/bvlc_reference_caffenet/train_val.prototxt")


def rcnn_weights(root):  # R-CNN's net is CaffeNet with a 200-class fc-rcnn: CaffeNet's fillers
    return random_caffemodel(root, "models/bvlc_reference_rcnn_ilsvrc13/deploy.prototxt",
                             "models/bvlc_reference_rcnn_ilsvrc13/bvlc_reference_rcnn_ilsvrc13.caffemodel",
                             "models/bvlc_reference_caffenet/train_val.prototxt")


def imagenet_mean(root):
    """python/caffe/imagenet/ilsvrc_2012_mean.npy (3 x 256 x 256, BGR) when the checkout lacks it (the mirror here
    holds Caffe's tree without this 1.5 MB file): a smooth image around ImageNet's channel means."""
    path = os.path.join(root, "python", "caffe", "imagenet", "ilsvrc_2012_mean.npy")
    if os.path.exists(path):
        return
    y, x = numpy.mgrid[0:256, 0:256] / 255.0
    mean = numpy.array([104.0, 117.0, 123.0])[:, None, None] + 10 * (x - y)[None]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    numpy.save(path, mean)


def imagenet_aux(root):
    """data/ilsvrc12 as get_ilsvrc_aux.sh leaves it: synset_words.txt (1000 classes), det_synset_words.txt (200) and
    imagenet_mean.binaryproto (3 x 256 x 256, BGR), with made-up synset ids and names."""
    from layerforge.caffe.blobproto import write_blobproto

    folder = os.path.join(root, "data", "ilsvrc12")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "synset_words.txt"), "w") as f:
        f.writelines(f"n{10000000 + i:08d} class {i}, thing {i}\n" for i in range(1000))
    detected = {23: "bicycle", 124: "person"}  # the detection notebook looks these two up by name
    with open(os.path.join(folder, "det_synset_words.txt"), "w") as f:
        f.writelines(f"n{20000000 + i:08d} {detected.get(i, f'object {i}')}, item {i}\n" for i in range(200))
    mean = numpy.empty((3, 256, 256), numpy.float32)
    mean[:] = numpy.array([104.0, 117.0, 123.0])[:, None, None]
    write_blobproto(os.path.join(folder, "imagenet_mean.binaryproto"), mean[None])


def mnist_lmdbs(root):
    """examples/mnist/mnist_{train,test}_lmdb from layerforge's bundled digits (create_mnist.sh's databases)."""
    from layerforge.data.examples import make_mnist

    make_mnist(root)


def mnist_idx(root, n=10000):
    """data/mnist/t10k-{images-idx3,labels-idx1}-ubyte as get_mnist.sh leaves them: ``n`` digits (the 5,000 bundled
    ones, repeated), in the idx format (big-endian header, then the bytes)."""
    from layerforge.data.mnist import load_digits

    images, labels = load_digits()
    reps = -(-n // len(images))
    images, labels = numpy.tile(images, (reps, 1, 1, 1))[:n], numpy.tile(labels, reps)[:n]
    folder = os.path.join(root, "data", "mnist")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "t10k-images-idx3-ubyte"), "wb") as f:
        f.write(numpy.array([2051, n, 28, 28], ">i4").tobytes() + images.astype(numpy.uint8).tobytes())
    with open(os.path.join(folder, "t10k-labels-idx1-ubyte"), "wb") as f:
        f.write(numpy.array([2049, n], ">i4").tobytes() + labels.astype(numpy.uint8).tobytes())


def coloured_images(folder, count, size, seed, classes):
    """``count`` JPEG images of ``size`` in ``folder`` whose colour follows their class: (paths, labels)."""
    import cv2

    rs = numpy.random.RandomState(seed)
    os.makedirs(folder, exist_ok=True)
    paths, labels = [], rs.randint(classes, size=count)
    for i, label in enumerate(labels):
        tint = numpy.array([(label * 53) % 256, (label * 97 + 40) % 256, (label * 151 + 80) % 256])
        image = numpy.clip(tint + rs.randn(size[0], size[1], 3) * 40, 0, 255).astype(numpy.uint8)
        paths.append(os.path.join(folder, f"{i:05d}.jpg"))
        cv2.imwrite(paths[-1], image)
    return paths, labels


def flickr_style(root, images=60, classes=5):
    """What assemble_data.py writes: data/flickr_style/{train,test}.txt (``path label``) over images it downloaded,
    here ``images`` generated 256 x 256 JPEGs in ``classes`` styles, two thirds for training; absolute paths, as
    assemble_data.py writes them."""
    folder = os.path.join(os.path.abspath(root), "data", "flickr_style")
    paths, labels = coloured_images(os.path.join(folder, "images"), images, (256, 256), 1701, classes)
    cut = 2 * images // 3
    for name, rows in (("train", slice(0, cut)), ("test", slice(cut, None))):
        with open(os.path.join(folder, f"{name}.txt"), "w") as f:
            f.writelines(f"{p} {y}\n" for p, y in zip(paths[rows], labels[rows]))


PASCAL_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
                  "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
                  "tvmonitor")


def pascal_voc(root, images=48):
    """data/pascal/VOC2012 as the PASCAL download unpacks: JPEGImages, Annotations (one or two objects each) and
    ImageSets/Main/{train,val}.txt, over ``images`` generated pictures."""
    voc = os.path.join(root, "data", "pascal", "VOC2012")
    paths, labels = coloured_images(os.path.join(voc, "JPEGImages"), images, (200, 240), 7, len(PASCAL_CLASSES))
    os.makedirs(os.path.join(voc, "Annotations"), exist_ok=True)
    os.makedirs(os.path.join(voc, "ImageSets", "Main"), exist_ok=True)
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    for name, label in zip(names, labels):
        objects = "".join(f"<object><name>{PASCAL_CLASSES[c]}</name><bndbox><xmin>{10 + k}</xmin><ymin>20</ymin>"
                          f"<xmax>120</xmax><ymax>150</ymax></bndbox></object>"
                          for k, c in enumerate({label, (label * 7) % 20}))
        with open(os.path.join(voc, "Annotations", f"{name}.xml"), "w") as f:
            f.write(f"<annotation><filename>{name}.jpg</filename>{objects}</annotation>")
    cut = 2 * images // 3
    for split, rows in (("train", names[:cut]), ("val", names[cut:])):
        with open(os.path.join(voc, "ImageSets", "Main", f"{split}.txt"), "w") as f:
            f.writelines(n + "\n" for n in rows)


def ssd_checkout_files(root):
    """The files of the SSD fork's checkout its notebooks read, where the folder is not such a checkout (CI's copy
    of tests/caffe_examples/caffe): data/VOC0712/labelmap_voc.prototxt (the fork's, from tests/net/ssd_files) and,
    for examples/images/fish-bike.jpg, a generated picture of its size."""
    import shutil

    label_map = os.path.join(root, "data", "VOC0712", "labelmap_voc.prototxt")
    if not os.path.exists(label_map):
        os.makedirs(os.path.dirname(label_map), exist_ok=True)
        shutil.copy(os.path.join(TESTS, "net", "ssd_files", "labelmap_voc.prototxt"), label_map)
    image = os.path.join(root, "examples", "images", "fish-bike.jpg")
    if not os.path.exists(image):
        import cv2

        os.makedirs(os.path.dirname(image), exist_ok=True)
        ramp = numpy.add.outer(numpy.arange(375), numpy.arange(500)) % 256
        cv2.imwrite(image, numpy.stack([ramp, ramp[::-1], ramp[:, ::-1]], -1).astype(numpy.uint8))


def ssd300_trained(root):
    """What the SSD fork's examples/ssd/ssd_pascal.py leaves after training SSD300 on VOC0712: its deploy.prototxt
    (the file tests/caffe/fork_models/ssd300_vgg16.prototxt holds, which that script writes) and, for its
    weights, a random caffemodel from the fillers the file names (xavier)."""
    import shutil

    ssd_checkout_files(root)
    folder = os.path.join(root, "models", "VGGNet", "VOC0712", "SSD_300x300")
    os.makedirs(folder, exist_ok=True)
    deploy = os.path.join(folder, "deploy.prototxt")
    if not os.path.exists(deploy):
        shutil.copy(os.path.join(TESTS, "caffe", "fork_models", "ssd300_vgg16.prototxt"), deploy)
    for iterations in (60000, 120000):  # the notebook's and ssd_detect.py's
        random_caffemodel(root, "models/VGGNet/VOC0712/SSD_300x300/deploy.prototxt",
                          f"models/VGGNet/VOC0712/SSD_300x300/VGG_VOC0712_SSD_300x300_iter_{iterations}.caffemodel")


def ssd300_training(root):
    """What the SSD fork's data/VOC0712/create_data.sh and examples/ssd/ssd_pascal.py leave before training: the
    VOC0712 AnnotatedDatum LMDBs linked under examples/VOC0712/ (here layerforge's synthetic shapes set, written by
    its convert_annoset: 16 training and 8 test images of 4 classes, labels 1 to 4), the train, test and solver
    prototxts the script writes (tests/net/ssd_files holds them) and the VGG-16 fc_reduced weights (random)."""
    import shutil

    from layerforge.data import shapes

    databases = shapes.make(os.path.join(root, "examples", "_shapes"), counts=(16, 8))
    os.makedirs(os.path.join(root, "examples", "VOC0712"), exist_ok=True)
    for split, db in zip(("trainval", "test"), databases):
        link = os.path.join(root, "examples", "VOC0712", f"VOC0712_{split}_lmdb")
        if not os.path.lexists(link):
            os.symlink(db, link)
    # create_list.sh's test_name_size.txt, by the tool it runs (here tools/get_image_size)
    import subprocess

    subprocess.run([sys.executable, os.path.join(os.path.dirname(TESTS), "tools", "get_image_size"),
                    os.path.dirname(databases[1]), os.path.join(os.path.dirname(databases[1]), "test.txt"),
                    os.path.join(root, "data", "VOC0712", "test_name_size.txt")], check=True, capture_output=True)
    ssd300_trained(root)
    folder = os.path.join(root, "models", "VGGNet", "VOC0712", "SSD_300x300")
    for name in ("train", "test", "solver"):
        shutil.copy(os.path.join(TESTS, "net", "ssd_files", f"SSD300_{name}.prototxt"),
                    os.path.join(folder, f"{name}.prototxt"))
    # the notebook's one SGD step on 2 images of the 16 (its cells read the batch size from the blobs): SSD300's
    # step and AUTO's timing of its 28 convolutions at 300 x 300 are most of this test's time
    edit_file(root, "models/VGGNet/VOC0712/SSD_300x300/train.prototxt",
              [("    batch_size: 4\n", "    batch_size: 2\n", "time")])
    random_caffemodel(root, "models/VGGNet/VOC0712/SSD_300x300/deploy.prototxt",
                      "models/VGGNet/VGG_ILSVRC_16_layers_fc_reduced.caffemodel")


def detection_windows(root):
    """examples/_temp/det_input.csv: windows (filename,ymin,xmin,ymax,xmax) over fish-bike.jpg in place of the
    selective search proposals (its MATLAB package cannot be had here): a grid of boxes of three sizes."""
    image = os.path.join(root, "examples", "images", "fish-bike.jpg")
    import cv2

    h, w = cv2.imread(image).shape[:2]
    rows = []
    for size in (100, 180, 260):
        for y in range(0, max(1, h - size), size // 2):
            for x in range(0, max(1, w - size), size // 2):
                rows.append(f"{image},{y},{x},{min(h, y + size)},{min(w, x + size)}\n")
    os.makedirs(os.path.join(root, "examples", "_temp"), exist_ok=True)
    with open(os.path.join(root, "examples", "_temp", "det_input.csv"), "w") as f:
        f.write("filename,ymin,xmin,ymax,xmax\n")
        f.writelines(rows)


def edit_file(root, path, edits):
    """Apply (old, new, reason) edits to a script of the checkout that a notebook runs (once: edited text stays)."""
    from notebooks import apply_edits

    path = os.path.join(root, path)
    with open(path) as f:
        text = f.read()
    todo = [e for e in edits if e[1] not in text]
    if todo:
        with open(path, "w") as f:
            f.write(apply_edits(text, todo, path))


def detect_py_for_pandas(root):
    """python/detect.py's ``df.to_hdf(file, 'df', mode='w')``: pandas 3 takes the key by name only (library)."""
    edit_file(root, "python/detect.py", [("df.to_hdf(args.output_file, 'df', mode='w')",
                                          "df.to_hdf(args.output_file, key='df', mode='w')", "library")])


def python3_sources(root):
    """examples/pycaffe's Python files (tools, layers) are Python 2: the notebooks import them, so port them."""
    from notebooks import port_to_python3

    folder = os.path.join(root, "examples", "pycaffe")
    for dirpath, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    text = f.read()
                ported = port_to_python3(text)
                if ported != text:
                    with open(path, "w") as f:
                        f.write(ported)


def scipy_misc_imresize(root):
    """scipy.misc.imresize (removed in SciPy 1.3; the PASCAL data layer calls it): PIL's bilinear resize to uint8,
    as SciPy's was, put back on scipy.misc for this run."""
    import scipy.misc
    from PIL import Image

    def imresize(arr, size):
        return numpy.asarray(Image.fromarray(numpy.asarray(arr, numpy.uint8)).resize((size[1], size[0]),
                                                                                     Image.BILINEAR))

    scipy.misc.imresize = imresize


# ---------------------------------------------------------------------------------------------------------------
# the notebooks

def _python(call):
    return f"python:{call}"


NOTEBOOKS = {
    "00-classification": {
        "path": "examples/00-classification.ipynb",
        "prepare": [caffenet_weights, imagenet_aux, imagenet_mean],
        "shell": [(r"download_model_binary\.py", None), (r"get_ilsvrc_aux\.sh", None),
                  (r"^wget ", _python("import shutil; shutil.copy('images/cat.jpg', 'image.jpg')"))],
    },
    "01-learning-lenet": {
        "path": "examples/01-learning-lenet.ipynb",
        "prepare": [],
        "shell": [(r"get_mnist\.sh", None),  # the digits are bundled with layerforge
                  (r"create_mnist\.sh", _python("__import__('caffe_notebooks').mnist_lmdbs('.')"))],
        "edits": {36: [("test_interval = niter / 10", "test_interval = niter // 10", "py3")]},
    },
    "02-fine-tuning": {
        "path": "examples/02-fine-tuning.ipynb",
        "prepare": [caffenet_weights, imagenet_aux],
        "shell": [(r"get_ilsvrc_aux\.sh", None), (r"download_model_binary\.py", None),
                  (r"assemble_data\.py", _python("__import__('caffe_notebooks').flickr_style('.')"))],
        # CaffeNet at batch 50 on 2 CPU cores: 200 iterations of 2 solvers, twice, take hours here
        "quick": {32: [("niter = 200", "niter = 3", "time")]},
        "edits": {8: [("delimiter='\\n'", "delimiter='\\t'", "library")],  # numpy 2: no newline delimiter
                  10: [("tempfile.NamedTemporaryFile(delete=False)", "tempfile.NamedTemporaryFile('w', delete=False)",
                        "py3")],
                  28: [("tempfile.NamedTemporaryFile(delete=False)", "tempfile.NamedTemporaryFile('w', delete=False)",
                        "py3")]},
    },
    "brewing-logreg": {
        "path": "examples/brewing-logreg.ipynb",
        "prepare": [],
        "shell": [(r"build/tools/caffe train -solver ", lambda cmd: cmd.replace(
            "./build/tools/caffe train -solver ", f"{sys.executable} -m layerforge train --solver "))],
        "edits": {5: [("loss='log', n_iter=1000", "loss='log_loss', max_iter=1000", "library")]},
    },
    "detection": {
        "path": "examples/detection.ipynb",
        "prepare": [rcnn_weights, imagenet_aux, imagenet_mean, detection_windows, detect_py_for_pandas],
        "shell": [(r"detect\.py", lambda cmd: f"{sys.executable} " + cmd.replace(
            "--crop_mode=selective_search", "--crop_mode=list").replace(
            "_temp/det_input.txt", "_temp/det_input.csv").replace(" --gpu", "" if not has_gpu() else " --gpu"))],
        "edits": {5: [("labels_df.sort('synset_id')", "labels_df.sort_values('synset_id')", "library")],
                  9: [("max_s.sort(ascending=False)", "max_s = max_s.sort_values(ascending=False)", "library")],
                  11: [("f.order(ascending=False)", "f.sort_values(ascending=False)", "library")],
                  14: [("scores[:, np.newaxis]", "scores.values[:, np.newaxis]", "library")]},
    },
    "net_surgery": {
        "path": "examples/net_surgery.ipynb",
        "prepare": [caffenet_weights, imagenet_mean],
        "shell": [],
    },
    "pascal-multilabel-with-datalayer": {
        "path": "examples/pascal-multilabel-with-datalayer.ipynb",
        "prepare": [caffenet_weights, pascal_voc, python3_sources, scipy_misc_imresize],
        "shell": [(r"download_model_binary\.py", None)],
        # CaffeNet at batch 128 on 2 CPU cores: 600 iterations and 345 test batches take hours here
        "quick": {18: [("solver.step(100)", "solver.step(1)", "time"), ("range(6)", "range(2)", "time"),
                       ("check_accuracy(solver.test_nets[0], 50)", "check_accuracy(solver.test_nets[0], 1)", "time")],
                  20: [("5823/128", "2", "time")]},
        "edits": {13: [("astype(np.int)", "astype(int)", "library")],
                  20: [("5823/128", "5823//128", "py3")],  # (the quick run replaces it first)
                  22: [("astype(np.int)", "astype(int)", "library")]},
    },
    "ssd": {  # the SSD fork's (weiliu89/caffe, branch ssd)
        "path": "examples/ssd.ipynb",
        "prepare": [ssd300_training],
        "shell": [],
    },
    "ssd_detect": {  # the SSD fork's
        "path": "examples/ssd_detect.ipynb",
        "prepare": [ssd300_trained],
        "shell": [],
    },
    "siamese": {
        "path": "examples/siamese/mnist_siamese.ipynb",
        "prepare": [mnist_idx, lambda root: random_caffemodel(
            root, "examples/siamese/mnist_siamese.prototxt", "examples/siamese/mnist_siamese_iter_50000.caffemodel",
            "examples/siamese/mnist_siamese_train_test.prototxt")],
        "shell": [],
        "edits": {5: [("np.fromstring(", "np.frombuffer(", "library")]},
    },
}

if not has_gpu():
    for _config in NOTEBOOKS.values():
        _config["gpu_lines"] = GPU_LINES
