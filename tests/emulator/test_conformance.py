"""The emulated cupy against the real one (cupy-cuda13x, a dev dependency that imports without a device):
every cupy attribute layerforge's source uses and every name the stand-in defines exist in the real
package, and every signature of the stand-in accepts only what the real one accepts.

The real cuBLAS and NCCL modules load libcublas / libnccl when imported; where those are absent (no CUDA
here) empty libraries of the same names stand in, enough to import the modules and read their documented
signatures. A signature that can be read neither by ``inspect`` nor from a Cython docstring is listed by
name in the report and fails this test until it is named in READ_ELSEWHERE with where it was checked."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STUB_LIBRARIES = ("libcublas.so.13", "libcublasLt.so.13", "libnccl.so.2")
READ_ELSEWHERE = {}  # dotted name -> where its signature was checked by hand (none today)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    stubs = tmp_path_factory.mktemp("cuda_stubs")
    source = stubs / "empty.c"
    source.write_text("")
    for name in STUB_LIBRARIES:
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(stubs / name), f"-Wl,-soname,{name}", str(source)],
                       check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "LAYERFORGE_EMULATED_GPU"}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [env.get("LD_LIBRARY_PATH"), str(stubs)]))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "conformance_check.py")], capture_output=True,
                          text=True, env=env, timeout=120, cwd=str(stubs))
    assert proc.returncode == 0, f"the real cupy (pip install -e '.[dev]' brings cupy-cuda13x): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout)


def test_the_scan_finds_what_layerforge_uses(report):
    uses = set(report["layerforge_uses"])
    for path in ("cupy.cuda.Stream.null.record", "cupy_backends.cuda.libs.cublas.gemmStridedBatchedEx",
                 "cupy.cuda.nccl.NcclCommunicator", "cupy.cuda.runtime.hostRegister", "cupy.add.at",
                 "cupy.random.RandomState", "cupy.cuda.nvtx", "cupyx.empty_pinned"):
        assert path in uses, path


def test_every_attribute_layerforge_uses_exists_in_cupy(report):
    assert report["layerforge_uses_missing"] == []


def test_every_name_of_the_stand_in_exists_in_cupy(report):
    assert report["stand_in_missing"] == [] and report["checked"] > 400


def test_every_signature_accepts_only_what_cupys_accepts(report):
    assert report["signatures_differ"] == []
    assert sorted(report["signatures_unreadable"]) == sorted(READ_ELSEWHERE)
