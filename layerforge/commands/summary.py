"""``layerforge summary NET.yaml``: one row per layer with top shapes, parameters and multiply-adds."""
from ..logs import format_bytes, format_shape
from ..net.memory import memory_report
from ..net.net import Net

HELP = "print each layer's type, top shapes, parameter count and forward multiply-adds, with totals"


def add_arguments(parser):
    parser.add_argument("net", help="net YAML file")
    parser.add_argument("--phase", choices=("train", "test"), default="test", help="which phase's layers to show")


def summarize(net):
    """Rows ``(name, type, [top shapes], params, multiply_adds)`` and totals for a built Net.

    A shared parameter counts once, against the first layer that owns it; running statistics
    (BatchNorm) are not learnable and not counted.
    """
    rows, seen = [], set()
    total_macs = 0
    for i, layer in enumerate(net.layers):
        params = 0
        if layer.learnable:
            for b in layer.blobs:
                if id(b) not in seen:
                    seen.add(id(b))
                    params += b.count
        macs = int(layer.multiply_adds(net.bottom_blobs(i), net.top_blobs(i)))
        total_macs += macs
        rows.append((layer.name, layer.type, [tuple(b.shape) for b in net.top_blobs(i)], params, macs))
    return rows, net.num_learnable, total_macs


def layer_memory_bytes(net):
    """Bytes of each layer's new top blobs and parameters (data + diff; a blob counts at its first layer)."""
    seen, out = set(), []
    for i, layer in enumerate(net.layers):
        fresh = [b for b in list(net.top_blobs(i)) + list(layer.blobs) if id(b) not in seen]
        seen.update(id(b) for b in fresh)
        out.append(sum(2 * b.count * b.dtype.itemsize for b in fresh))
    return out


def run(args):
    net = Net(args.net, phase=args.phase)
    rows, total_params, total_macs = summarize(net)
    memory, report = layer_memory_bytes(net), memory_report(net)
    print(f"net '{net.name}', phase {args.phase.upper()} (--phase train shows the training net)"
          if args.phase == "test" else f"net '{net.name}', phase {args.phase.upper()}")
    header = ("layer", "type", "top shape", "params", "multiply-adds", "memory")
    table = [(n, t, " ".join(format_shape(s) for s in shapes), f"{p:,}", f"{m:,}", format_bytes(mem))
             for (n, t, shapes, p, m), mem in zip(rows, memory)]
    print_table(header, table)
    batch = batch_size(net)
    print(f"total learnable parameters: {total_params:,}")
    per_image = f" ({total_macs / batch:,.0f} per image)" if batch > 1 else ""
    print(f"total multiply-adds (forward, batch {batch}): {total_macs:,}{per_image}")
    print(f"memory (data + diff, before activation sharing): activations "
          f"{format_bytes(report['activation_bytes'])}, parameters {format_bytes(report['param_bytes'])}, "
          f"layer buffers {format_bytes(report['layer_bytes'])}, total {format_bytes(report['peak_bytes'])}")
    return 0


def print_table(header, rows, left=3):
    """Print ``rows`` of strings under ``header`` in aligned columns (the first ``left`` left-aligned)."""
    widths = [max(len(row[k]) for row in list(rows) + [header]) for k in range(len(header))]
    fmt = "  ".join(f"{{:{'<' if k < left else '>'}{w}}}" for k, w in enumerate(widths))
    print(fmt.format(*header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(fmt.format(*row))


def batch_size(net):
    """The first axis of the net's first non-scalar top: the batch the net was built for."""
    for i in range(len(net.layers)):
        for b in net.top_blobs(i):
            if b.data.ndim:
                return max(1, b.shape[0])
    return 1
