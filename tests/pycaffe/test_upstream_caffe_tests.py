"""Caffe's own python tests (python/caffe/test of a Caffe source tree), run unmodified against layerforge.

They are not part of this repository (Caffe's files); give their folder in LAYERFORGE_CAFFE_TESTS, e.g.
``LAYERFORGE_CAFFE_TESTS=$HOME/caffe/python/caffe/test python -m pytest tests/pycaffe``. test_draw.py walks
``models/`` and ``examples/`` three levels up, so point at a whole Caffe checkout's test folder.
"""
import os
import subprocess
import sys

import pytest

from .test_import_caffe import python_path

FOLDER = os.environ.get("LAYERFORGE_CAFFE_TESTS")


@pytest.mark.skipif(not FOLDER, reason="LAYERFORGE_CAFFE_TESTS (a Caffe checkout's python/caffe/test) not set")
def test_caffes_python_tests_pass_unmodified():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([python_path(), os.environ.get("PYTHONPATH", "")]))
    # Caffe's `make pytest`: unittest discovery from the python folder
    out = subprocess.run([sys.executable, "-m", "unittest", "discover", "-s", "caffe/test"], capture_output=True,
                         text=True, env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(FOLDER))))
    assert out.returncode == 0, out.stderr[-4000:]
    assert "OK" in out.stderr.splitlines()[-1]
