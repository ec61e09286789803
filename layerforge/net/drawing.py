"""A net drawn as a graph, as Caffe's python/caffe/draw.py does: layers as boxes (name, type and the parameters the
definition sets), blobs as labelled edges (name, and shape when the net is built), in-place layers in the chain of
their blob, the automatic Split layers left out (their readers connect to the blob's producer).

:func:`graph` draws a built Net, :func:`definition_graph` a definition that is not built (its data need not exist);
:func:`to_dot` writes DOT text and :func:`render` a file: .svg/.png/.pdf through Graphviz's ``dot`` when it is
installed, else through matplotlib (:func:`render_matplotlib`). ``layerforge draw`` and pycaffe's ``caffe.draw`` call
these.

The matplotlib layout is the usual one for data-flow graphs (Sugiyama's): each node's rank is the length of the
longest path from a source, so every edge points down; nodes within a rank are ordered by the mean
position of their neighbours in the rank above, then below (a few sweeps reduce crossings); ranks are
centred. Boxes hold the node's label lines, edges carry the blob name and shape at their midpoint.
"""
import collections
import os
import shutil
import subprocess

from ..errors import LayerforgeError
from ..layers.layer_param import layer_included
from ..logs import format_shape
from ..schema import Params

RENDERED = ("svg", "png", "pdf")
# fillers and file-level details add noise to a box; the rest of the given parameters are shown
_HIDDEN = {"weight_filler", "bias_filler", "filler", "data_filler", "engine", "prefetch", "decode_workers", "rank",
           "world_size"}
_COLOURS = {"Convolution": "#f4a582", "InnerProduct": "#92c5de", "Pooling": "#b8e186", "Data": "#fee08b",
            "ImageData": "#fee08b", "DummyData": "#fee08b", "SyntheticData": "#fee08b", "Input": "#fee08b",
            "Concat": "#d9d9d9", "Eltwise": "#d9d9d9", "BatchNorm": "#e0e0f8", "Scale": "#e0e0f8", "LRN": "#e0e0f8"}


# inches per text line and per character of the widest line (10 pt Helvetica-like), and the gaps
_LINE_H, _CHAR_W, _GAP_X, _GAP_Y = 0.17, 0.075, 0.35, 0.55


def ranks_of(nodes, edges):
    """``{node: rank}``: the longest path from a node without inputs (edges go from rank r to > r)."""
    incoming = collections.defaultdict(list)
    for a, b, _ in edges:
        incoming[b].append(a)
    rank = {}
    for n in nodes:  # nodes come in topological order (the net's layer order)
        rank[n] = 1 + max((rank[a] for a in incoming[n] if a in rank), default=-1)
    return rank


def order_ranks(nodes, edges, rank, sweeps=4):
    """Nodes per rank, ordered by the barycentre of their neighbours (fewer crossings)."""
    rows = collections.defaultdict(list)
    for n in nodes:
        rows[rank[n]].append(n)
    up, down = collections.defaultdict(list), collections.defaultdict(list)
    for a, b, _ in edges:
        down[a].append(b)
        up[b].append(a)
    levels = sorted(rows)
    for sweep in range(sweeps):
        order = levels[1:] if sweep % 2 == 0 else levels[-2::-1]
        neighbours = up if sweep % 2 == 0 else down
        for r in order:
            pos = {n: i for row in rows.values() for i, n in enumerate(row)}
            def key(n, r=r):
                ns = [pos[m] for m in neighbours[n] if m in pos]
                return sum(ns) / len(ns) if ns else pos[n]
            rows[r].sort(key=key)
    return [rows[r] for r in levels]


def _with_dummies(nodes, edges, rank):
    """Split every edge that spans several ranks into a chain through dummy nodes, one per rank crossed.

    Returns the node order (dummies right after their source), the unit edges and, per original edge,
    the chain of node ids its line passes through.
    """
    order, chains, unit = list(nodes), [], []
    for k, (a, b, _) in enumerate(edges):
        chain = [a]
        for r in range(rank[a] + 1, rank[b]):
            dummy = ("dummy", k, r)
            rank[dummy] = r
            order.append(dummy)
            chain.append(dummy)
        chain.append(b)
        unit += [(u, v, "") for u, v in zip(chain, chain[1:])]
        chains.append(chain)
    return order, unit, chains


def render_matplotlib(nodes, edges, path, rankdir="TB"):
    """Draw ``nodes`` ({id: (label lines, fill colour, shape "box"|"ellipse")}) and ``edges``
    ([(from id, to id, label)]) to ``path`` (.svg, .png or .pdf) with matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.patches import Ellipse, FancyArrowPatch, FancyBboxPatch
    from matplotlib.path import Path

    rank = ranks_of(list(nodes), edges)
    order, unit, chains = _with_dummies(nodes, edges, rank)
    rows = order_ranks(order, unit, rank)
    size = {n: (max(len(s) for s in nodes[n][0]) * _CHAR_W + 0.2, len(nodes[n][0]) * _LINE_H + 0.12)
            for n in nodes}
    size.update({n: (0.25, 0.0) for n in order if n not in nodes})  # a dummy is just room for a line
    horizontal = rankdir in ("LR", "RL")
    along, across = (0, 1) if horizontal else (1, 0)  # which box side runs along the ranks' direction
    row_h = [max(size[n][along] for n in row) for row in rows]
    row_w = [sum(size[n][across] for n in row) + _GAP_X * (len(row) - 1) for row in rows]
    width, centre, y = max(row_w), {}, 0.0
    for row, h, w in zip(rows, row_h, row_w):
        x = (width - w) / 2
        for n in row:
            centre[n] = (x + size[n][across] / 2, y + h / 2)
            x += size[n][across] + _GAP_X
        y += h + _GAP_Y
    height = y - _GAP_Y

    def place(u, v):
        """Layout coordinates (u across the ranks, v down them) -> figure coordinates for ``rankdir``."""
        if horizontal:
            return (height - v if rankdir == "RL" else v), width - u
        return u, (v if rankdir == "BT" else height - v)

    def port(n, side):
        """Where an edge leaves (side +1, the box's far side) or enters (-1) node ``n``."""
        u, v = centre[n]
        return place(u, v + side * size[n][along] / 2)

    fig_w, fig_h = (height, width) if horizontal else (width, height)
    fig = pyplot.figure(figsize=(max(fig_w, 1.0) + 0.4, max(fig_h, 1.0) + 0.4))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-0.2, fig_w + 0.2)
    ax.set_ylim(-0.2, fig_h + 0.2)
    ax.axis("off")
    for chain, (_, _, label) in zip(chains, edges):
        points = [port(chain[0], +1)] + [place(*centre[d]) for d in chain[1:-1]] + [port(chain[-1], -1)]
        route = Path(points, [Path.MOVETO] + [Path.LINETO] * (len(points) - 1))
        ax.add_patch(FancyArrowPatch(path=route, arrowstyle="-|>", mutation_scale=8, color="#555555", lw=0.8,
                                     zorder=1))
        if label:
            (xa, ya), (xb, yb) = points[0], points[1]
            ax.text((xa + xb) / 2, (ya + yb) / 2, label, fontsize=6.5, ha="center", va="center", color="#333333",
                    zorder=3, bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.85))
    for n, (lines, colour, shape) in nodes.items():
        x, y = place(*centre[n])
        w, h = size[n]
        if shape == "ellipse":
            patch = Ellipse((x, y), w, h + 0.1, fc=colour, ec="#333333", lw=0.8, zorder=2)
        else:
            patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.06",
                                   fc=colour, ec="#333333", lw=0.8, zorder=2)
        ax.add_patch(patch)
        ax.text(x, y, "\n".join(lines), fontsize=8, ha="center", va="center", zorder=4, linespacing=1.15)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG text stays text: searchable, small
        fig.savefig(path)
    pyplot.close(fig)
    return path


def _quote(text):
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _value(v):
    if isinstance(v, tuple) and all(isinstance(x, int) for x in v):
        return format_shape(v)  # a shape
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            return _value(v[0])
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def key_params(lp, per_line=3):
    """The scalar parameters a layer's YAML sets, as ``key: value`` lines (fillers left out)."""
    items = []
    for block, params in lp.__dict__.items():
        if not isinstance(params, Params) or block in _HIDDEN:
            continue
        for key, v in params.as_dict().items():
            if not params.given(key) or key in _HIDDEN or isinstance(v, Params) or v is None:
                continue
            if isinstance(v, (list, tuple)) and any(isinstance(x, Params) for x in v):
                continue
            items.append(f"{key}: {_value(v)}")
    return ["  ".join(items[k:k + per_line]) for k in range(0, len(items), per_line)]


def graph(net):
    """The drawn graph of a built Net: ``(nodes, edges)`` with nodes ``{id: (label lines, colour, shape)}``
    in the net's order and edges ``[(from id, to id, label)]``."""
    nodes, edges = {}, []
    producer = {}  # id(blob) -> node id of the layer whose value it currently holds
    alias = {}     # id(split output) -> the name of the blob it copies
    for i, layer in enumerate(net.layers):
        bottoms, tops = net.bottom_blobs(i), net.top_blobs(i)
        if layer.type == "Split":
            for t in tops:
                producer[id(t)] = producer.get(id(bottoms[0]))
                alias[id(t)] = alias.get(id(bottoms[0]), net.bottom_names(i)[0])
            continue
        node = f"l{i}"
        nodes[node] = ([layer.name, f"({layer.type})"] + key_params(layer.layer_param),
                       _COLOURS.get(layer.type, "#ffffff"), "box")
        for name, b in zip(net.bottom_names(i), bottoms):
            source = producer.get(id(b))
            if source is not None:
                edges.append((source, node, f"{alias.get(id(b), name)}\n{format_shape(tuple(b.shape))}"))
        for t in tops:
            producer[id(t)] = node
    for k, name in enumerate(net.outputs):
        b = net.blobs[name]
        if producer.get(id(b)) is not None:
            nodes[f"o{k}"] = ([name], "#eeeeee", "ellipse")
            edges.append((producer[id(b)], f"o{k}", format_shape(tuple(b.shape))))
    return nodes, edges


def definition_graph(netdef, phase="TRAIN", level=0, stages=()):
    """The drawn graph of a net definition that is not built (its data need not exist): layers as boxes
    (name, type, given parameters), blobs named on the edges, without shapes. Same form as :func:`graph`."""
    nodes, edges, producer = {}, [], {}
    for i, lp in enumerate(l for l in netdef.layers if layer_included(l, phase.upper(), level, tuple(stages))):
        node = f"l{i}"
        nodes[node] = ([lp.name, f"({lp.type})"] + key_params(lp), _COLOURS.get(lp.type, "#ffffff"), "box")
        edges += [(producer[b], node, b) for b in lp.bottom if b in producer]
        producer.update((t, node) for t in lp.top)
    return nodes, edges


def to_dot(net, rankdir="TB", drawn=None):
    """DOT text for a built Net (or for a ``drawn`` (nodes, edges) graph of a net named ``net``)."""
    name = net if isinstance(net, str) else net.name
    lines = [f"digraph {_quote(name)} {{", f"  rankdir={rankdir};",
             '  node [shape=box, style="rounded,filled", fillcolor="#ffffff", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9];']
    nodes, edges = drawn or graph(net)
    for node, (label, colour, shape) in nodes.items():
        extra = ", shape=ellipse, style=filled" if shape == "ellipse" else ""
        lines.append(f"  {node} [label={_quote(chr(10).join(label))}{extra}, fillcolor={_quote(colour)}];")
    lines += [f"  {a} -> {b} [label={_quote(label)}];" for a, b, label in edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(net, path, rankdir="TB", engine="auto", drawn=None):
    """Draw ``net`` to ``path``: DOT text for .dot; .svg/.png/.pdf through Graphviz's ``dot`` when it is
    installed (``engine`` "auto" or "graphviz"), else (or with ``engine="matplotlib"``) through matplotlib.
    ``drawn`` gives the (nodes, edges) graph to draw instead of the built ``net``'s (``net`` is then its name)."""
    drawn = drawn or graph(net)
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext in ("dot", "gv"):
        with open(path, "w", encoding="utf-8") as f:
            f.write(to_dot(net, rankdir, drawn))
        return path
    if ext not in RENDERED:
        raise LayerforgeError(f"{path}: unknown output format '.{ext}'; use .svg, .png, .pdf or .dot")
    dot = shutil.which("dot") if engine != "matplotlib" else None
    if dot is None:
        if engine == "graphviz":
            raise LayerforgeError(f"writing {path} with --engine graphviz needs Graphviz's 'dot' (not installed)")
        try:
            return render_matplotlib(*drawn, path, rankdir)
        except OSError as e:
            raise LayerforgeError(f"{path}: cannot write: {e.strerror}") from None
    proc = subprocess.run([dot, f"-T{ext}", "-o", path], input=to_dot(net, rankdir, drawn), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise LayerforgeError(f"dot failed on {path}: {proc.stderr.strip().splitlines()[-1] if proc.stderr else ''}")
    return path
