"""Snapshots in Caffe's formats (solver ``snapshot_format: BINARYPROTO`` or ``HDF5``), and restoring from them.

As Caffe's Solver::Snapshot, a snapshot at iteration N writes ``<prefix>_iter_N.caffemodel`` (the train
net, layerforge.caffe.caffemodel) and ``<prefix>_iter_N.solverstate``, a SolverState: ``iter``,
``learned_net`` (the weights path as written), ``history`` (the rule's state blobs in Caffe's order:
``history[k * n + i]`` is state k of learnable parameter i) and ``current_step`` (the step/multistep
lr counter). HDF5 writes ``.caffemodel.h5`` and ``.solverstate.h5`` with datasets ``iter``,
``learned_net``, ``current_step`` and ``history/<i>``, as Caffe's SnapshotSolverStateToHDF5 does.

These formats hold no random-stream state, data-layer read positions or smoothed loss: a run resumed from
them continues from the weights, history and iteration only, as Caffe does (layerforge's ``.npz``
snapshots resume exactly).
"""
import logging
import os

import numpy

from .. import backend
from ..errors import LayerforgeError
from . import caffe_pb
from .caffemodel import array_to_blob, blob_to_array, read_message, save_caffemodel, save_hdf5, write_message
from .hdf5 import stored

log = logging.getLogger("layerforge")
_WORDS = {"BINARYPROTO": "binary proto", "HDF5": "HDF5"}
SUFFIXES = {"BINARYPROTO": (".caffemodel", ".solverstate"), "HDF5": (".caffemodel.h5", ".solverstate.h5")}


def is_caffe_state(path):
    """Whether ``path`` is a solver state in one of Caffe's formats (by extension)."""
    return str(path).endswith((".solverstate", ".solverstate.h5"))


def current_step(sp, it):
    """Caffe's ``current_step_`` after ``it`` iterations: the steps the step / multistep policy has taken."""
    if it <= 0:
        return 0
    if sp.lr_policy == "STEP":
        return (it - 1) // sp.stepsize
    if sp.lr_policy == "MULTISTEP":
        return sum(1 for v in sp.stepvalue if v <= it - 1)
    return 0


def snapshot(solver, base, fmt):
    """Write ``base`` + the format's weights and state suffixes; returns the state path."""
    weights, state = (base + s for s in SUFFIXES[fmt])
    it, step = solver.iter, current_step(solver.param, solver.iter)
    history = [backend.to_numpy(h) for h in solver.history]
    log.info("Snapshotting to %s file %s", _WORDS[fmt], weights)
    log.info("Snapshotting solver state to %s file %s", _WORDS[fmt], state)
    if fmt == "BINARYPROTO":
        save_caffemodel(solver.net, weights)
        message = caffe_pb.SolverState(iter=it, learned_net=weights, current_step=step)
        for h in history:
            array_to_blob(h, message.history.add())
        write_message(state, message)
    else:
        save_hdf5(solver.net, weights)
        _write_hdf5_state(state, it, weights, step, history)
    return state


def _write_hdf5_state(path, it, weights, step, history):
    import h5py

    from ..npz import write_atomic

    def write(f):
        with h5py.File(f, "w") as h5:
            h5.create_dataset("iter", data=numpy.array([it], numpy.int32))
            name = weights.encode()
            h5.create_dataset("learned_net", data=numpy.array(name + b"\0", dtype=f"S{len(name) + 1}"))
            h5.create_dataset("current_step", data=numpy.array([step], numpy.int32))
            group = h5.create_group("history")
            for i, h in enumerate(history):
                group.create_dataset(str(i), data=h)
    write_atomic(path, write)


def read_state(path):
    """``(iter, learned_net, [history arrays])`` of a .solverstate or .solverstate.h5."""
    path = os.fspath(path)
    if path.endswith(".h5"):
        return _read_hdf5_state(path)
    message = read_message(path, caffe_pb.SolverState, "Caffe solver state (.solverstate)")
    if not message.HasField("iter"):
        raise LayerforgeError(f"{path}: not a Caffe solver state (.solverstate): it has no 'iter'")
    history = [blob_to_array(b, f"{path}: history {i}") for i, b in enumerate(message.history)]
    return message.iter, message.learned_net, history


def _read_hdf5_state(path):
    import h5py
    try:
        h5 = h5py.File(path, "r")
    except OSError as e:
        raise LayerforgeError(f"{path}: not a readable HDF5 solver state: {e}") from None
    with h5:
        missing = [k for k in ("iter", "history") if k not in h5]
        if missing:
            raise LayerforgeError(f"{path}: not a Caffe HDF5 solver state: no '{missing[0]}'")
        it = int(numpy.asarray(stored(h5, "iter", path)[()]).ravel()[0])
        learned = stored(h5, "learned_net", path)
        learned = learned[()] if learned is not None else b""
        learned = (learned.decode() if isinstance(learned, bytes) else str(learned)).rstrip("\0")
        group = stored(h5, "history", path)
        history = [stored(group, str(i), path) for i in range(len(group))]
        if any(h is None for h in history):
            raise LayerforgeError(f"{path}: not a Caffe HDF5 solver state: no 'history/{history.index(None)}'")
        history = [h[()] for h in history]
    return it, learned, history


def restore(solver, path):
    """Resume ``solver`` from a Caffe-format state: weights from ``learned_net`` and history; returns the iteration
    (the solver takes it)."""
    path = os.fspath(path)
    it, learned, history = read_state(path)
    if it < 0:
        raise LayerforgeError(f"{path}: 'iter' is {it}; a solver state counts the iterations done, from 0")
    if len(history) != len(solver.history):
        raise LayerforgeError(f"{path}: holds {len(history)} history blobs but this {solver.type} solver has "
                              f"{len(solver.history)}")
    for i, (a, h) in enumerate(zip(history, solver.history)):
        if a.size != h.size:
            raise LayerforgeError(f"{path}: history {i} has shape {tuple(a.shape)}, the net's parameter "
                                  f"{tuple(h.shape)}; was it written for another net?")
        h[...] = solver.xp.asarray(a.reshape(h.shape), dtype=h.dtype)
    if learned:
        # Caffe stores the path as written (relative to its working directory); look beside the state too
        if not os.path.exists(learned):
            learned = os.path.join(os.path.dirname(path), os.path.basename(learned))
        solver.net.copy_from(learned)
    return it
