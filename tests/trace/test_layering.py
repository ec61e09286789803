"""layerforge.trace sits beside the foundation: it imports only foundation modules (so every package may call it),
and never cupy, tensorboardX or matplotlib when it is imported (those load where they are used)."""
import ast
import os

import pytest

import layerforge.trace

FOUNDATION = {"errors", "backend", "rng", "registry", "npz", "schema", "blob", "fillers", "logs", "cores"}
HEAVY = {"cupy", "tensorboardX", "tensorboard", "matplotlib", "torch", "mpi4py"}
FOLDER = os.path.dirname(layerforge.trace.__file__)
MODULES = sorted(f for f in os.listdir(FOLDER) if f.endswith(".py"))


def imports(tree):
    """``(module, at module level)`` for every import of a parsed file; relative ones as ``..x`` / ``.x``."""
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            yield "." * node.level + (node.module or ""), id(node) in top


@pytest.mark.parametrize("module", MODULES)
def test_imports_only_the_foundation(module):
    with open(os.path.join(FOLDER, module)) as f:
        tree = ast.parse(f.read())
    for name, module_level in imports(tree):
        if name.startswith("..") or name.startswith("layerforge."):
            package = name.lstrip(".").split(".")[0] if name.startswith("..") else name.split(".")[1]
            assert package in FOUNDATION, f"{module} imports {name}"
        elif not name.startswith("."):
            assert not (module_level and name.split(".")[0] in HEAVY), f"{module} imports {name} at import time"
