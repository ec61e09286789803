"""benchmarks/bench_breakdown.py --interference: replica 0's layers alone against beside the other replica, by kind."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_interference_prints_each_kind_alone_and_together(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_breakdown.py"), "--nets", "lenet",
                           "--replicas", "2", "--interference", "--iterations", "1"], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT, LAYERFORGE_CACHE_DIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "lenet, fp32, replica 0 of 2 (one thread, batch / 2)" in out
    rows = {cells[0]: [float(c) for c in cells[1:]] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
        if re.match(r"\| [^-|][^|]* \|( [-+]?\d+\.?\d* \|){6}$", line))}
    # LeNet's two 5x5 convolutions (by their engines), its pooling, inner products, ReLU and loss, and the sum
    convolutions = [kind for kind in rows if re.fullmatch(r"5x5 [A-Z0-9_/]+", kind)]
    assert convolutions and {"Pooling", "InnerProduct", "ReLU", "layers"} <= set(rows), sorted(rows)
    for kind in convolutions + ["Pooling", "InnerProduct"]:
        alone_fwd, alone_bwd, together_fwd, together_bwd, loss, _ = rows[kind]
        assert alone_fwd > 0 and alone_bwd > 0 and together_fwd > 0 and together_bwd > 0, (kind, rows[kind])
        # the table's five figures are each rounded to 0.1 ms: the printed loss is within 5 x 0.05 of the sum
        assert abs(loss - (together_fwd + together_bwd - alone_fwd - alone_bwd)) <= 0.25 + 1e-9, (kind, rows[kind])
    total = rows["layers"]
    for column in range(4):
        assert abs(total[column] - sum(v[column] for k, v in rows.items() if k != "layers")) < 0.1 * len(rows)
    assert re.search(r"whole passes after them \(forward \+ backward\): alone [\d.]+ and [\d.]+, together [\d.]+", out)
    line = next(line for line in out.splitlines() if line.startswith("the layers that lose the most: "))
    named = re.findall(r"(\w+) \(([^)]+)\) [-+][\d.]+", line)
    assert len(named) == 5 and {name for name, _ in named} <= {"data", "conv1", "pool1", "conv2", "pool2", "ip1",
                                                              "relu1", "ip2", "loss"}, line
