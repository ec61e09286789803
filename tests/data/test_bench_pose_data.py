"""benchmarks/bench_pose_data.py --quick: makes its genLMDB.py-style records, runs CPMData, PyTorch's DataLoader with the
same transform and one core, and prints a row per worker count with the tops' shapes the fork's prototxt gives."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_benchmark_prints_a_row_per_worker_count(tmp_path):
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_pose_data.py"), "--quick",
                           "--out", str(tmp_path / "set")], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("CPU: ") and lines[1].startswith("BLAS: ")
    assert lines[3].startswith("12 records of 6 x 120 x 160")
    rows = json.loads(lines[-1])
    assert [row["workers"] for row in rows] == [1, 2]
    for row in rows:
        assert all(row[kind] > 0 for kind in ("layerforge", "torch", "limit"))
    table = [line for line in lines if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(table) == 2 and all(len(line.split("|")) == 7 for line in table)
    assert os.path.exists(tmp_path / "set" / "pose_12_120x160_lmdb" / "data.mdb")


def test_layerforge_and_torch_make_the_forks_shapes(tmp_path):
    """Both pipelines give the shapes of the fork's COCO prototxt at the crop asked (6 channels, 114 maps)."""
    pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import bench_pose_data
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    db = bench_pose_data.make_set(str(tmp_path), 12, 120, 160)
    for kind in ("layerforge", "torch"):
        result = bench_pose_data.measure(kind, db, 1, 1, 96)
        assert result["shapes"] == [[10, 6, 96, 96], [10, 114, 12, 12]], kind
