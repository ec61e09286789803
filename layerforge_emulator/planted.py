"""Planted removals of stream synchronisation, for the tests that show the emulated device catches each one.

``LAYERFORGE_EMULATED_GPU_REMOVE=module|Function.qualname|call text`` (set by tests/emulator/test_stream_sites.py):
when ``module`` is imported in a process where the emulated device is installed, the statement inside that function
that is that call of ``.wait_event(`` or ``.synchronize(`` (its text as written, e.g. ``slot.copied.synchronize()``)
is replaced by ``pass`` before the module is compiled (line numbers unchanged). Subprocesses inherit the variable, so CGDP's workers and ``layerforge``
commands run the planted code too. A site that is not found raises ImportError naming it: a test's table of
sites cannot go stale silently.
"""
import ast
import importlib.abc
import importlib.util
import os
import sys

REMOVE_ENV = "LAYERFORGE_EMULATED_GPU_REMOVE"
METHODS = ("wait_event", "synchronize")


def stream_calls(source):
    """The statements of ``source`` that are a call of ``.wait_event(`` / ``.synchronize(``: a list of
    ``(qualname of the enclosing function, the call's text, first line, last line)``."""
    found = []

    def visit(node, names):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, names + [child.name])
                continue
            if (isinstance(child, ast.Expr) and isinstance(child.value, ast.Call)
                    and isinstance(child.value.func, ast.Attribute) and child.value.func.attr in METHODS):
                found.append((".".join(names), ast.get_source_segment(source, child.value), child.lineno,
                              child.end_lineno))
            visit(child, names)

    visit(ast.parse(source), [])
    return found


def remove(source, qualname, call):
    """``source`` with the statement ``call`` in ``qualname`` replaced by ``pass`` (lines kept)."""
    sites = [s for s in stream_calls(source) if s[:2] == (qualname, call)]
    if len(sites) != 1:
        raise ImportError(f"{REMOVE_ENV}: {len(sites)} statements {call} in {qualname}, not one")
    _, _, first, last = sites[0]
    lines = source.splitlines(keepends=True)
    indent = lines[first - 1][:len(lines[first - 1]) - len(lines[first - 1].lstrip())]
    lines[first - 1:last] = [indent + "pass  # planted: removed\n"] + ["\n"] * (last - first)
    return "".join(lines)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, module, qualname, call):
        self.module, self.qualname, self.call = module, qualname, call

    def find_spec(self, name, path, target=None):
        if name != self.module:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        loader, qualname, call = spec.loader, self.qualname, self.call

        class Planted(type(loader)):
            def get_code(self, fullname):
                source = remove(loader.get_source(fullname), qualname, call)
                return compile(source, loader.get_filename(fullname), "exec", dont_inherit=True)

        spec.loader = Planted(loader.name, loader.path)
        return spec


def install_if_requested():
    """Put the removal ``REMOVE_ENV`` asks for in place (once per process)."""
    value = os.environ.get(REMOVE_ENV)
    if not value or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    module, qualname, call = value.split("|")
    if module in sys.modules:
        raise ImportError(f"{REMOVE_ENV}: {module} was imported before the emulated device was installed")
    sys.meta_path.insert(0, _Finder(module, qualname, call))
