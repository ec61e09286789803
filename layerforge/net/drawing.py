"""A layered drawing of a layer graph through matplotlib, for machines without Graphviz.

The layout is the usual one for data-flow graphs (Sugiyama's): each node's rank is the length of the
longest path from a source, so every edge points down; nodes within a rank are ordered by the mean
position of their neighbours in the rank above, then below (a few sweeps reduce crossings); ranks are
centred. Boxes hold the node's label lines, edges carry the blob name and shape at their midpoint.
"""
import collections

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
