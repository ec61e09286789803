"""Iteration-time model of host mode (T) and of the tree baseline (T'), from measured per-layer times.

Our reading of the paper's Definitions 3.1-3.4 (docs/cgdp.md derives them). Chunks c = 1..C in backward
order; b_l is the backward time of layer l, n_c the values of chunk c; F, B, U the forward, backward
and update times of one replica.

* 3.1 ready time: chunk c can leave once its last layer has run, r_c = sum of b_l over the layers up to and
  including it (backward order).
* 3.2 chunk exchange: three resources in a pipeline, each serving chunks in order -- the copy-out engine
  (o_c = n_c * t_copy), the host threads (a_c(G) = n_c * t_acc * (3G + 1) / 4: the sum of G slots reads
  G and writes one, per value, relative to G = 1) plus a per-chunk synchronisation latency lam, and the
  copy-back engine (i_c = n_c * t_copy):
  out_c = max(r_c, out_{c-1}) + o_c; acc_c = max(out_c, acc_{c-1}) + a_c(G) + lam;
  back_c = max(acc_c, back_{c-1}) + i_c. The exposed exchange is E = max(0, back_C - B).
* 3.3 host mode: T = F + B + E + U (every replica updates at once, nobody waits for a server).
* 3.4 tree: nothing moves before backward ends: T' = F + B + n * t_copy (copy-out) + lam
  + n * t_acc * (3G - 1) / 4 (the root adds G - 1 slots and scales) + U (on the root alone)
  + 2 n * t_copy + lam (parameters out of the root and into the others).

The speed-up of G replicas over one (weak scaling, batch per replica fixed) is G * (F + B + U) / T.
"""


class CostModel:
    """Per-unit measurements of one replica (see the module docstring); times in seconds.

    Args:
        forward, update: F and U. backward: the per-unit backward segments b (backward order), each the
            backward time from the previous unit's layer (exclusive) to this unit's layer (inclusive);
            their sum plus ``backward_rest`` (layers below the last unit) is B.
        sizes: values per unit n. t_copy: seconds per value copied (device <-> host).
        t_acc: seconds per value per unit of the accumulation traffic (see 3.2). lam: per-chunk latency.
    """

    def __init__(self, forward, backward, sizes, update, t_copy, t_acc, lam=1e-4, backward_rest=0.0, tail=2):
        self.F, self.b, self.n, self.U = forward, list(backward), list(sizes), update
        self.t_copy, self.t_acc, self.lam, self.rest = t_copy, t_acc, lam, backward_rest
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
        r = out = acc = back = 0.0
        for b, n in self.chunks(chunk_size):
            r += b
            out = max(r, out) + n * self.t_copy
            acc = max(out, acc) + n * self.t_acc * (3 * G + 1) / 4 + self.lam
            back = max(acc, back) + n * self.t_copy
        return max(0.0, back - self.B)

    def host(self, G, chunk_size=1):
        """T of Definition 3.3."""
        return self.F + self.B + self.exposed(G, chunk_size) + self.U

    def tree(self, G):
        """T' of Definition 3.4."""
        n = sum(self.n)
        exchange = 3 * n * self.t_copy + n * self.t_acc * (3 * G - 1) / 4 + 2 * self.lam
        return self.F + self.B + exchange + self.U

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
    """A CostModel from a host-mode run's ``Result.stats`` (per-chunk times measured with chunk_size 1).

    t_copy is the mean of copy-out and copy-back seconds per value; t_acc the accumulate seconds per value
    divided by the traffic factor (3G + 1) / 4 of the run's G. ``compute`` (another run's ``phases_ms``)
    replaces F, B and U: on CPU workers that share cores and memory, a tree run's update (the root alone)
    is faster than host mode's (all replicas at once), so its own compute phases predict it better.
    """
    if compute is not None:
        stats = dict(stats, phases_ms=compute)
    ms, G, units = stats["chunks_ms"], stats["G"], stats["units"]
    layer_b = {int(i): t / 1000.0 for i, t in stats["layer_backward_ms"].items()}
    b, prev = [], None
    for layer, _, _ in units:
        b.append(sum(t for i, t in layer_b.items() if i >= layer and (prev is None or i < prev)))
        prev = layer
    rest = sum(t for i, t in layer_b.items() if prev is not None and i < prev)
    sizes = [n for _, _, n in units]
    total = sum(sizes) or 1
    copies = sum(ms.get(f"copy_out:{name}", 0.0) + ms.get(f"copy_back:{name}", 0.0) for _, name, _ in units)
    acc = sum(ms.get(f"accumulate:{name}", 0.0) for _, name, _ in units)
    phases = stats["phases_ms"]
    measured = phases.get("backward", 0.0) / 1000.0
    timed = sum(b) + rest
    if measured > 0 and timed > 0:  # the per-layer timers miss the hand-offs between layers: scale to B
        b, rest = [t * measured / timed for t in b], rest * measured / timed
    return CostModel(phases["forward"] / 1000.0, b, sizes, phases["update"] / 1000.0,
                     copies / 1000.0 / (2 * total), acc / 1000.0 / total / ((3 * G + 1) / 4),
                     lam=stats.get("latency_s", 1e-4), backward_rest=rest)
