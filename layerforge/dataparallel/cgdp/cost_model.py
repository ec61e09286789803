"""Iteration-time model of host mode (T) and of the tree baseline (T'), from measured per-layer times.

Our reading of the paper's Definitions 3.1-3.4 (docs/cgdp.md derives them). Chunks c = 1..C in backward
order; n_c the values of chunk c; F, B, U the forward, backward and update times of one replica. The
exchange is priced with :class:`Rates`, seconds per value of each operation, timed on an idle replica by
:func:`measure_rates` (the paper measures its link and memory bandwidths the same way).

* 3.1 ready time: chunk c can leave once its last layer has run, r_c = sum of the backward times of the
  layers up to and including it (backward order).
* 3.2 chunk exchange: three resources in a pipeline, each serving chunks in order -- the copy-out engine
  (o_c = n_c copy_out), the host threads (a_c(G) = n_c G host_combine: the mean of G slots written into
  every slot, for G > 1) plus a per-chunk synchronisation latency lam, and the copy-back engine
  (i_c = n_c copy_back): out_c = max(r_c, out_{c-1}) + o_c; acc_c = max(out_c, acc_{c-1}) + a_c(G) + lam;
  back_c = max(acc_c, back_{c-1}) + i_c. The exposed exchange is E = max(0, back_C - B). On CPU workers,
  whose diffs live in the shared slots, copy_out = copy_back = 0.
* 3.3 host mode: T = F + B + E + U (every replica updates at once, nobody waits for a server).
* 3.4 tree: nothing moves before backward ends: T' = F + B + n copy_out + lam (gradients to the host)
  + n ((G - 1) root_add + root_scale) (the root adds G - 1 slots and scales) + U (on the root alone)
  + n (param_out + param_in) + lam (parameters out of the root and into the others).

The speed-up of G replicas over one (weak scaling, batch per replica fixed) is G (F + B + U) / T.
"""
import collections
import time

import numpy

Rates = collections.namedtuple("Rates", "copy_out copy_back host_combine root_add root_scale param_out param_in")
Rates.__doc__ = """Seconds per value of the exchange's operations (one replica, idle machine).

copy_out: replica diffs -> host slot; copy_back: host slot -> replica diffs (both 0 where the diffs live
in the slot); host_combine: the host threads' mean of the slots written back into them, per value and
slot; root_add: tree mode's root adding one slot into its diffs (on a GPU this includes moving the slot to
the device); root_scale: the root's 1 / G scaling; param_out, param_in: a replica's parameters to the
host buffer and from it (tree mode's broadcast)."""


class CostModel:
    """Per-unit measurements of one replica (see the module docstring); times in seconds.

    Args:
        forward, update: F and U. backward: the per-unit backward segments (backward order), each the
            backward time from the previous unit's layer (exclusive) to this unit's layer (inclusive);
            their sum plus ``backward_rest`` (layers below the last unit) is B.
        sizes: values per unit n. rates: a :class:`Rates`. lam: per-chunk synchronisation latency.
    """

    def __init__(self, forward, backward, sizes, update, rates, lam=1e-4, backward_rest=0.0, tail=2):
        self.F, self.b, self.n, self.U = forward, list(backward), list(sizes), update
        self.rates, self.lam, self.rest = Rates(*rates), lam, backward_rest
        self.B = sum(self.b) + backward_rest
        self.tail = tail  # as make_chunks: the last units of backward travel alone

    def chunks(self, chunk_size):
        """(b, n) per chunk for ``chunk_size`` (units grouped as make_chunks does)."""
        from .chunks import Unit, make_chunks

        units = [Unit(k, str(k), [], 0, n) for k, n in enumerate(self.n)]
        out = []
        for c in make_chunks(units, chunk_size, self.tail):
            ks = [u.layer for u in c.units]
            out.append((sum(self.b[k] for k in ks), sum(self.n[k] for k in ks)))
        return out

    def exposed(self, G, chunk_size=1):
        """E of Definition 3.2."""
        r, slots = self.rates, (G if G > 1 else 0)
        ready = out = acc = back = 0.0
        for b, n in self.chunks(chunk_size):
            ready += b
            out = max(ready, out) + n * r.copy_out
            acc = max(out, acc) + n * r.host_combine * slots + self.lam
            back = max(acc, back) + n * r.copy_back
        return max(0.0, back - self.B)

    def host(self, G, chunk_size=1):
        """T of Definition 3.3."""
        return self.F + self.B + self.exposed(G, chunk_size) + self.U

    def tree_exchange(self, G):
        """The exchange part of Definition 3.4: gradients to the root, its sum, parameters back."""
        n, r = sum(self.n), self.rates
        reduce = n * ((G - 1) * r.root_add + r.root_scale) if G > 1 else 0.0
        return n * r.copy_out + reduce + n * (r.param_out + r.param_in) + 2 * self.lam

    def tree(self, G):
        """T' of Definition 3.4."""
        return self.F + self.B + self.tree_exchange(G) + self.U

    def speedup(self, G, mode="host", chunk_size=1):
        """G (F + B + U) / T for ``mode`` host or tree."""
        t = self.host(G, chunk_size) if mode == "host" else self.tree(G)
        return G * (self.F + self.B + self.U) / t

    def best_chunk_size(self, G):
        """The chunk size the model prefers for G replicas (ties: the larger, fewer synchronisations)."""
        sizes = range(1, max(1, len(self.n)) + 1)
        return min(sizes, key=lambda s: (round(self.host(G, s), 9), -s))

    def predict(self, G, chunk_size=1):
        """``{"host": T, "tree": T', "winner": ..., "ratio": T'/T}`` for G replicas."""
        t, t2 = self.host(G, chunk_size), self.tree(G)
        return {"G": G, "host": t, "tree": t2, "ratio": t2 / t, "winner": "host" if t <= t2 else "tree",
                "speedup_host": self.speedup(G, "host", chunk_size), "speedup_tree": self.speedup(G, "tree")}


def from_stats(stats, compute=None):
    """A CostModel from a run's stats (:class:`~layerforge.dataparallel.cgdp.pool.Result` ``.stats``).

    The per-layer backward times come from the run (host mode times them layer by layer; a tree run has
    only the total, so pass a host run's stats with ``compute`` = the tree run's ``phases_ms``); the rates
    from ``stats["rates"]`` (:func:`measure_rates`, run by worker 0 after training); ``compute`` replaces F,
    B and U: on CPU workers sharing cores and memory, each mode's own compute phases predict it better.
    """
    if compute is not None:
        stats = dict(stats, phases_ms=compute)
    units = stats["units"]
    layer_b = {int(i): t / 1000.0 for i, t in stats["layer_backward_ms"].items()}
    b, prev = [], None
    for layer, _, _ in units:
        b.append(sum(t for i, t in layer_b.items() if i >= layer and (prev is None or i < prev)))
        prev = layer
    rest = sum(t for i, t in layer_b.items() if prev is not None and i < prev)
    phases = stats["phases_ms"]
    measured = phases.get("backward", 0.0) / 1000.0
    timed = sum(b) + rest
    if measured > 0 and timed > 0:  # the per-layer timers miss the hand-offs between layers: scale to B
        b, rest = [t * measured / timed for t in b], rest * measured / timed
    return CostModel(phases["forward"] / 1000.0, b, [n for _, _, n in units], phases["update"] / 1000.0,
                     Rates(**stats["rates"]), lam=stats.get("latency_s", 1e-4), backward_rest=rest)


def predict_rows(stats, Gs=(2, 4, 8)):
    """Cost-model rows per G from a host-mode run's stats: host T and tree T' (ms) at chunk size 1, their
    ratio, the winner, the speed-ups over one replica and the chunk size the model prefers (with its T)."""
    m = from_stats(stats)
    rows = []
    for G in Gs:
        p, best = m.predict(G, 1), m.best_chunk_size(G)
        rows.append({"G": G, "host_ms": 1000 * p["host"], "tree_ms": 1000 * p["tree"], "ratio": p["ratio"],
                     "winner": p["winner"], "speedup_host": p["speedup_host"], "speedup_tree": p["speedup_tree"],
                     "best_chunk_size": best, "best_host_ms": 1000 * m.host(G, best)})
    return rows


def measure_rates(params, mover, slots, acc, xp, repeats=3):
    """Times the exchange's operations on this replica's parameters; returns a :class:`Rates` as a dict.

    Runs on worker 0 after training, while the other workers are gone and the parent has kept the final
    parameters: it overwrites the diffs, the parameters' host copy ``acc`` and the ``slots`` (G x P). The
    fastest of ``repeats`` runs of each operation. None for a net without parameters.
    """
    from .host import mean_into_slots
    from .tree import add_slots_to_diffs, scale_diffs

    n = sum(count for _, count in mover.offsets)
    if n == 0:
        return None
    everything = list(range(len(params)))

    def sync():
        mover.synchronize()
        if xp is not numpy:
            xp.cuda.get_current_stream().synchronize()

    def best(fn, values=n):
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times) / values

    two = slots[:2] if len(slots) > 1 else numpy.stack([slots[0], slots[0]])
    other = slots[1:2] if len(slots) > 1 else slots[:1]
    shared = mover.attached is not None  # the diffs live in the slot: gradients are never copied
    return Rates(copy_out=0.0 if shared else best(lambda: mover.to_host(everything, acc, mover.mark())),
                 copy_back=0.0 if shared else best(lambda: mover.to_device(everything, acc)),
                 host_combine=best(lambda: mean_into_slots(two), 2 * n),
                 root_add=best(lambda: add_slots_to_diffs(params, mover.offsets, other, xp)),
                 root_scale=best(lambda: scale_diffs(params, 0.5)),
                 param_out=best(lambda: mover.params_to_host(acc)),
                 param_in=best(lambda: mover.params_from_host(acc)))._asdict()


def measure_latency(link, repeats=20):
    """Per-chunk synchronisation latency lam, seconds: the median round trip of a message to the parent.

    A chunk's exchange crosses the same pipes and threads: the worker posts it, the parent hands it to a
    host thread and answers with ``ready``.
    """
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        link.send(("ping",))
        link.expect("pong")
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
