"""benchmarks/bench_data.py --quick: makes its JPEG set and LMDB, and prints both tables with a row per worker count."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_benchmark_prints_a_row_per_worker_count(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_data.py"), "--quick",
                           "--out", str(tmp_path / "set")], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert re.match(r"48 JPEGs of 500x375, \d+ KB on average", lines[0])
    pipeline = [line for line in lines if re.match(r"\s+\d+ \|.*x \|", line)]
    waits = [line for line in lines if re.match(r"\s+\d+ \|.*%$", line)]
    decode = [line for line in lines if re.match(r"\s+\d+ \|[\d ,|]+$", line)]
    for rows, columns in ((pipeline, 9), (waits, 5), (decode, 4)):
        assert [int(row.split("|")[0]) for row in rows] == [1, 2]
        for row in rows:
            cells = [c.strip() for c in row.split("|")]
            assert len(cells) == columns
            assert all(float(c.rstrip("%x").replace(",", "")) >= 0 for c in cells)
    assert len(os.listdir(tmp_path / "set" / "jpeg")) == 48 and (tmp_path / "set" / "lmdb" / "data.mdb").exists()
