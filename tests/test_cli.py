"""Command-line tools: summary, time, layers (check is covered in test_netdef.py)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from layerforge.commands.layers import markdown

ROOT = pathlib.Path(__file__).resolve().parents[1]

TINY = """\
name: tiny
layers:
  - {name: input, type: Input, top: [data, label], input: {shape: [[4, 1, 12, 12], [4]]}}
  - {name: conv, type: Convolution, bottom: data, top: conv, convolution: {num_output: 6, kernel_size: 5}}
  - {name: pool, type: Pooling, bottom: conv, top: pool, pooling: {pool: MAX, kernel_size: 2, stride: 2}}
  - {name: ip, type: InnerProduct, bottom: pool, top: ip, inner_product: {num_output: 10}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
"""


def layerforge(*args):
    return subprocess.run([sys.executable, "-m", "layerforge", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT)


def run_python(source, *args, timeout=120, **env):
    """``python -c source args`` with this checkout on its path and ``env`` added to its environment: its stdout,
    once it has exited 0; the test fails where it still runs ``timeout`` seconds on."""
    child = subprocess.Popen([sys.executable, "-c", source, *map(str, args)], text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT), **env))
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail(f"still running {timeout} s on: {child.communicate()}")
    assert child.returncode == 0, err[-3000:]
    return out


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def test_summary_counts_params_and_multiply_adds(tiny):
    proc = layerforge("summary", tiny)
    assert proc.returncode == 0, proc.stderr
    # conv: 6*1*5*5 + 6 = 156; ip: 10 * 6*4*4 + 10 = 970
    assert "total learnable parameters: 1,126" in proc.stdout
    # conv: 4 * 6*8*8 * 25 = 38,400; ip: 4 * 96 * 10 = 3,840
    assert "total multiply-adds (forward, batch 4): 42,240 (10,560 per image)" in proc.stdout
    conv_row = next(line for line in proc.stdout.splitlines() if line.startswith("conv "))
    # memory: top 4*6*8*8 + weights 156 values, data and diff, float32: 2 * 4 * (1536 + 156) = 13,536 B
    assert conv_row.split()[1:] == ["Convolution", "4x6x8x8", "156", "38,400", "13.2", "KiB"]
    assert proc.stdout.splitlines()[0].startswith("net 'tiny', phase TEST")
    assert "parameters 8.8 KiB" in proc.stdout  # 1,126 parameters * 2 * 4 B = 9,008 B


def test_time_prints_every_layer_and_totals(tiny):
    proc = layerforge("time", "--model", tiny, "--iterations", "2")
    assert proc.returncode == 0, proc.stderr
    for name in ("input", "conv", "pool", "ip", "loss"):
        assert any(line.startswith(name + " ") for line in proc.stdout.splitlines()), name
    assert "Average Forward pass:" in proc.stdout and "Average Forward-Backward:" in proc.stdout


def test_time_json_and_batch_override(tiny):
    proc = layerforge("time", "--model", tiny, "--iterations", "1", "--batch", "2", "--json")
    result = json.loads(proc.stdout)
    rows = {r["layer"]: r for r in result["layers"]}
    assert rows["conv"]["top_shape"] == [[2, 6, 8, 8]]
    assert result["forward_backward_ms"] == pytest.approx(result["forward_ms"] + result["backward_ms"])
    assert sum(r["share"] for r in result["layers"]) == pytest.approx(1.0)


@pytest.mark.parametrize("mode", ["THREADS", "REPLICAS"])
def test_time_json_images_per_second_of_whole_training_iterations(tiny, mode):
    proc = layerforge("time", "--model", tiny, "--iterations", "2", "--json", "--cpu-parallel", mode)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    training = result["training"]
    assert (training["cpu_parallel"], training["replicas"]) == (mode, 2 if mode == "REPLICAS" else 1)
    assert training["why"] == f"cpu_parallel: {mode}"
    assert result["images_per_second"] == training["images_per_second"] > 0
    assert training["images_per_second"] * training["iteration_ms"] / 1000 == pytest.approx(4)  # the batch
    text = layerforge("time", "--model", tiny, "--iterations", "1", "--cpu-parallel", mode)
    assert f"Training iteration (forward, backward, exchange, update) as train runs it, {mode}" in text.stdout
    assert "images/s." in text.stdout


def test_layers_reference_is_current():
    assert (ROOT / "docs" / "layers.md").read_text() == markdown(), \
        "docs/layers.md is stale: run `layerforge layers --markdown > docs/layers.md`"


def test_layers_unknown_type():
    proc = layerforge("layers", "Convolutoin")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown layer type 'Convolutoin'; did you mean 'Convolution'?"


def test_lenet_summary_matches_caffe():
    proc = layerforge("summary", "configs/lenet.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "total learnable parameters: 431,080" in proc.stdout
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[3:]
            if line and not line.startswith(("total", "memory"))}
    assert rows["conv1"][-4:-2] == ["520", "28,800,000"]
    assert rows["loss"][2] == "scalar"


def test_version_and_defaults_in_help():
    proc = layerforge("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == "layerforge 0.1.0"
    proc = layerforge("time", "--help")
    text = " ".join(proc.stdout.split())
    assert "(default: 20)" in text and "AUTO convolution engines settle" in text
