"""Snapshots of a training run and resuming from them (Caffe's Solver::Snapshot / Restore).

A snapshot is two files, each written atomically: the weights (``PREFIX_iter_N.npz``) and the solver state
(``PREFIX_iter_N.solverstate.npz``: iteration, update history, the random stream, every data layer's read
position, AUTO's engine choices, the recent losses), so a resumed run computes exactly what an uninterrupted one
would; or Caffe's .caffemodel / .solverstate (and .h5 flavours) as ``snapshot_format`` says
(layerforge/caffe/solverstate.py). No pickles: JSON strings in 0-d arrays.

Replicas in processes of their own (MPI ranks) each have their own random stream, read positions (in their
shard) and engine choices (each times AUTO's engines itself): the snapshot keeps every replica's (``replicas``,
gathered through the solver's seam), and a job resumed on as many replicas gives each its own back, so that it
computes what the uninterrupted job would, bit for bit. Resumed on another number of replicas, every replica
starts from the first replica's state with its read positions scaled to the records all replicas read so far
(``position * saved replicas / replicas``).
"""
import collections
import json
import logging
import os

import numpy

from .. import backend, rng
from ..caffe import solverstate
from ..errors import LayerforgeError
from ..npz import load_npz, save_npz_atomic, shape_of

log = logging.getLogger("layerforge")


def snapshot_prefix(sp):
    """The path prefix of the snapshots of SolverParameter ``sp``: ``snapshot_prefix`` (relative to the working
    directory), else the solver file's name without extension (``solver`` for a solver given as a mapping)."""
    return sp.snapshot_prefix or (os.path.splitext(os.path.basename(sp.path))[0] if sp.path else "solver")


def snapshot(solver):
    """Write PREFIX_iter_N.npz (weights) and PREFIX_iter_N.solverstate.npz, each atomically (or Caffe's
    .caffemodel and .solverstate, with their .h5 flavours, as ``snapshot_format`` says).

    Returns the solver-state path (None on non-root ranks). Non-finite weights are never written.
    """
    base = f"{solver.snapshot_prefix}_iter_{solver.iter}"
    fmt = solver.param.snapshot_format
    replicas = solver.seam.gather_states([_json(_own_state(solver))]) if fmt == "NPZ" else None
    if not solver.root:  # rank (replica) 0 writes it: this one's report of a non-finite loss names it as 0's does
        solver.last_snapshot = base + (".solverstate.npz" if fmt == "NPZ" else solverstate.SUFFIXES[fmt][1])
        return None
    for layer in solver.net.layers:
        if not all(finite(b.data) for b in layer.blobs):
            raise solver.non_finite_error(f"the parameters of layer '{layer.name}' ({layer.type}) became "
                                         "non-finite in the update; no snapshot of them is written", scan=False)
    if solver.param.snapshot_format != "NPZ":  # Caffe's .caffemodel + .solverstate (or their .h5)
        solver.last_snapshot = solverstate.snapshot(solver, base, solver.param.snapshot_format)
        return solver.last_snapshot
    weights, state = base + ".npz", base + ".solverstate.npz"
    log.info("Snapshotting to %s", weights)
    solver.net.save(weights)
    log.info("Snapshotting solver state to %s", state)
    save_npz_atomic(state, state_arrays(solver, os.path.basename(weights), replicas))
    solver.last_snapshot = state
    return state


def state_arrays(solver, learned_net="", replicas=None):
    """The solver state as ``{name: array}`` (no pickles: JSON strings in 0-d arrays); ``replicas``: the JSON texts
    of every replica's own state (:func:`snapshot` gathers them), this replica's alone when None."""
    own = _own_state(solver)
    arrays = {
        "iter": numpy.array(solver.iter, dtype=numpy.int64),
        "type": numpy.array(solver.type or ""),
        "learned_net": numpy.array(learned_net),
        "rng": numpy.array(json.dumps(own["rng"])),
        "data_state": numpy.array(_json(own["data_state"])),
        "replicas": numpy.array("[" + ",".join(replicas or [_json(own)]) + "]"),
        "losses": numpy.array(list(solver.losses), dtype=numpy.float64),
    }
    for i, h in enumerate(solver.history):
        arrays[f"history/{i}"] = backend.to_numpy(h)
    return arrays


def _own_state(solver):
    """What of the state is this replica's own: its random stream and its layers' states."""
    return {"rng": rng.get_state(), "data_state": _data_states(solver)}


def _json(value):
    return json.dumps(value, default=_jsonable)


def _nets(solver):
    return [("train", solver.net)] + [(f"test/{k}", tn) for k, tn in enumerate(solver.test_nets)]


def _data_states(solver):
    return {key: {layer.name: _whole_batch_state(net, layer.get_state()) for layer in net.layers
                  if hasattr(layer, "get_state")} for key, net in _nets(solver)}


def _whole_batch_state(net, state):
    # a replica of a split batch (Net(split=...)) has read 1/count of the records one process has: its snapshot
    # gives the one process's position, so that either kind of run resumes it
    if net.split is None or "position" not in state:
        return state
    return dict(state, position=int(state["position"]) * net.split[1])


def _replica_state(net, state, path, name, world=(1, 1)):
    """The saved ``state`` of layer ``name`` as this replica takes it: its read position, counted in its shard of
    ``world[0]`` replicas, moved to a shard of ``world[1]`` replicas, then divided among a split batch's replicas."""
    if not isinstance(state, dict) or "position" not in state:
        return state
    saved, now = world
    position = int(state["position"]) * saved
    if position % now:
        raise LayerforgeError(f"{path}: layer '{name}' read {position // saved} records on each of {saved} ranks, "
                              f"which do not split evenly over {now} ranks; resume on a number of ranks that "
                              f"divides {position}")
    position //= now
    count = net.split[1] if net.split is not None else 1
    if position % count:
        raise LayerforgeError(f"{path}: layer '{name}' read {position} records, which do not split into {count} "
                              f"equal replica shares; resume it with cpu_parallel THREADS")
    return dict(state, position=position // count)


def restore(solver, path):
    """Resume from a ``.solverstate.npz``: weights, iteration, history, random stream, data positions.

    A Caffe ``.solverstate`` (or ``.solverstate.h5``) restores weights, iteration and history only."""
    path = str(path)
    log.info("Restoring previous solver status from %s", path)
    from ..caffe import solverstate
    if solverstate.is_caffe_state(path):
        solver.iter = solverstate.restore(solver, path)
        return None
    arrays = load_npz(path)
    if "iter" not in arrays or "learned_net" not in arrays:
        hint = ""
        if path.endswith(".npz") and os.path.exists(path[:-4] + ".solverstate.npz"):
            hint = f"; did you mean '{path[:-4]}.solverstate.npz'?"
        raise LayerforgeError(f"{path}: not a solver state (weights alone start training with 'weights'){hint}")
    fields = _state_fields(solver, arrays, path)
    n = len(solver.history)
    kept = sum(1 for k in arrays if k.startswith("history/"))
    if kept != n:
        raise LayerforgeError(f"{path}: holds {kept} history arrays ({arrays['type'].item() or 'unknown'} solver) "
                              f"but this {solver.type} solver has {n}")
    for i, h in enumerate(solver.history):
        shape = tuple(shape_of(arrays, f"history/{i}"))  # from the header alone: a wrong entry is never read
        if shape != tuple(h.shape):
            raise LayerforgeError(f"{path}: history/{i} has shape {shape}, the net's parameter "
                                  f"{tuple(h.shape)}; was it written for another net?")
        h[...] = solver.xp.asarray(arrays[f"history/{i}"], dtype=h.dtype)
    weights = arrays["learned_net"].item()
    if weights and not os.path.isabs(weights):
        weights = os.path.join(os.path.dirname(path), weights)
    solver.net.load(weights)
    solver.iter, random_state, states, losses, replicas = fields
    index, count = solver.seam.replica()
    world = (1, 1)
    if replicas is not None and len(replicas) == count:  # each replica takes its own back (the first's: rng, data_state)
        if index:
            random_state, states = replicas[index]["rng"], replicas[index]["data_state"]
    elif replicas is not None:
        world = (len(replicas), count)
        log.info("%s was written by %d replicas, resumed by %d: each starts from the first one's state, its read "
                 "positions scaled to the records all of them read", path, len(replicas), count)
    rng.set_state(random_state)
    for key, net in _nets(solver):
        for layer in net.layers:
            saved = states.get(key, {}).get(layer.name) if isinstance(states.get(key), dict) else None
            if saved is not None and hasattr(layer, "set_state"):
                try:
                    layer.set_state(_replica_state(net, saved, path, layer.name, world))
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    raise LayerforgeError(f"{path}: the saved state of layer '{layer.name}' ({key} net) is "
                                          f"malformed ({type(e).__name__}: {e})") from None
    solver.losses = collections.deque(losses, maxlen=solver.param.average_loss)
    solver.smoothed_loss = sum(solver.losses) / len(solver.losses) if solver.losses else 0.0


def _state_fields(solver, arrays, path):
    """``(iter, rng state, layer states, losses, every replica's own state or None)`` of a solver-state file,
    each checked before any is used;
    a field that is not what this solver writes is one LayerforgeError naming it."""
    def field(name, parse):
        try:
            return parse(arrays[name])
        except KeyError:
            raise LayerforgeError(f"{path}: has no '{name}'; not a complete solver state") from None
        except (TypeError, ValueError, AttributeError) as e:  # json's errors are ValueErrors
            raise LayerforgeError(f"{path}: field '{name}' is malformed ({str(e).splitlines()[0][:120]})") \
                from None
        except RecursionError:  # JSON nested deeper than Python's stack (json.loads recurses)
            raise LayerforgeError(f"{path}: field '{name}' is malformed (nested too deeply to read)") from None

    def iteration(a):
        if a.shape != () or a.dtype.kind not in "iu":
            raise ValueError(f"expected a whole number of iterations, got {_shown(a)}")
        if int(a) < 0:
            raise ValueError(f"expected a whole number of iterations, got {int(a)}")
        return int(a)

    def random_state(state):
        probe = type(rng.get_rng().bit_generator)()
        probe.state = state  # a state of another generator, or a broken one, is refused here
        return state

    def layer_states(states):
        if not isinstance(states, dict):
            raise ValueError("expected a mapping of nets to layer states")
        return states

    def replica_states(replicas):
        if not isinstance(replicas, list) or not replicas or not all(
                isinstance(own, dict) and {"rng", "data_state"} <= set(own) for own in replicas):
            raise ValueError("expected a list of every replica's random stream and layer states")
        return [{"rng": random_state(own["rng"]), "data_state": layer_states(own["data_state"])} for own in replicas]

    def text(parse):
        return lambda a: parse(json.loads(a.item()))

    saved_type = field("type", lambda a: str(a.item())) if "type" in arrays else ""
    if saved_type and saved_type != solver.type:
        log.warning("%s was written by a %s solver; continuing with %s", path, saved_type, solver.type)
    return (field("iter", iteration), field("rng", text(random_state)), field("data_state", text(layer_states)),
            field("losses", lambda a: [float(v) for v in a]),
            field("replicas", text(replica_states)) if "replicas" in arrays else None)  # older snapshots: none


def _shown(a):
    text = repr(a.tolist()) if a.size <= 4 else f"an array of shape {a.shape}"
    return text if len(text) <= 40 else text[:37] + "..."


def finite(a):
    return bool(backend.get_array_module(a).isfinite(a).all())


def _jsonable(value):
    if isinstance(value, numpy.generic):
        return value.item()
    if isinstance(value, numpy.ndarray):
        return value.tolist()
    raise TypeError(f"data layer state value {value!r} is not JSON-serialisable")
