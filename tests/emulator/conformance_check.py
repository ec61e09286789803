"""Run by test_conformance.py in a process without the emulator: compares the emulated cupy with the real
cupy package (cupy-cuda13x, which imports without a device). Prints one JSON object.

The real package's CUDA-library modules (cuBLAS, NCCL) load their shared libraries when imported; where
those are missing the caller puts empty stand-in libraries on LD_LIBRARY_PATH and this script opens
extensions with lazy binding, which is enough to read the modules' names and documented signatures (no
function is called)."""
import ast
import importlib
import inspect
import json
import os
import re
import sys
import types

sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_GLOBAL)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOTS = {"cupy", "cp", "xp", "cupyx"}
TOP = ("cupy", "cupyx", "cupy_backends")


def _chain(node):
    """``a.b.c`` -> ["a", "b", "c"] for Name/Attribute chains (``self.xp.cuda`` -> ["xp", "cuda"])."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def used_by_layerforge():
    """Every cupy attribute path the package's source names: ``cupy.x.y`` / ``xp.x.y`` chains, cupy imports,
    and importlib strings, as dotted paths below ``cupy`` (or ``cupyx`` / ``cupy_backends``)."""
    used = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "layerforge")):
        for name in files:
            if not name.endswith(".py"):
                continue
            tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
            aliases = {}  # local names bound to cupy modules: `from cupy.cuda import nccl` -> nccl
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in TOP:
                    aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute):
                    chain = _chain(node)
                    if chain and chain[0] in ("self", "net") and len(chain) > 1 and chain[1] in ("xp", "cupy"):
                        chain = ["cupy"] + chain[2:]
                    elif chain and chain[0] in aliases:
                        chain = aliases[chain[0]].split(".") + chain[1:]
                    elif chain and chain[0] in ROOTS:
                        chain = ["cupyx" if chain[0] == "cupyx" else "cupy"] + chain[1:]
                    else:
                        continue
                    chain = [p for p in chain if not p.startswith("__")]
                    if len(chain) > 1:
                        used.add(".".join(chain))
                elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in TOP:
                    used.update(f"{node.module}.{a.name}" for a in node.names)
                elif isinstance(node, ast.Import):
                    used.update(a.name for a in node.names if a.name.split(".")[0] in TOP and "." in a.name)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                        re.fullmatch(r"cupy(\.\w+)+", node.value):
                    used.add(node.value)
    # keep only the longest paths: cupy.cuda.Stream.null.record covers cupy.cuda.Stream
    return sorted(p for p in used if not any(q.startswith(p + ".") for q in used))


def resolve(path):
    """The real object at a dotted path, importing submodules on the way; raises AttributeError if absent."""
    parts = path.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if not hasattr(obj, part):
            try:
                obj = importlib.import_module(".".join(parts[:i + 1]))
                continue
            except ImportError:
                raise AttributeError(f"{path}: no '{part}' in {'.'.join(parts[:i])}") from None
        obj = getattr(obj, part)
    return obj


DOC_SIGNATURE = re.compile(r"^[\w.]*?(\w+)\((.*?)\)(\s*->.*)?$")


def _doc_signature(obj):
    """A Cython function's signature from its embedded docstring line (``name(int a, str b=None, *, c=1)``)."""
    first = (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
    match = DOC_SIGNATURE.match(first)
    if not match:
        return None
    params, kind = [], inspect.Parameter.POSITIONAL_OR_KEYWORD
    for raw in filter(None, (p.strip() for p in _split(match.group(2)))):
        if raw in ("*", "/"):
            kind = inspect.Parameter.KEYWORD_ONLY if raw == "*" else kind
            continue
        if raw.startswith("**"):
            params.append(inspect.Parameter(raw[2:], inspect.Parameter.VAR_KEYWORD))
            continue
        if raw.startswith("*"):
            params.append(inspect.Parameter(raw[1:], inspect.Parameter.VAR_POSITIONAL))
            kind = inspect.Parameter.KEYWORD_ONLY
            continue
        declaration, _, default = raw.partition("=")
        name = re.findall(r"\w+", declaration)[-1]
        params.append(inspect.Parameter(name, kind, default=default.strip() if default else inspect.Parameter.empty))
    return inspect.Signature(params)


def _split(text):
    depth, part = 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            yield part
            part = ""
            continue
        depth += ch in "([{"
        depth -= ch in ")]}"
        part += ch
    yield part


def signature(obj):
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return _doc_signature(obj)


def _without_self(sig):
    params = list(sig.parameters.values())
    return params[1:] if params and params[0].name == "self" else params


def incompatible(ours, real):
    """Why a call the stand-in accepts would fail on the real signature (None when every such call works)."""
    P = inspect.Parameter
    mine, theirs = _without_self(ours), _without_self(real)
    real_positional = [p for p in theirs if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    real_names = {p.name: p for p in theirs if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    has_args = any(p.kind == P.VAR_POSITIONAL for p in theirs)
    has_kwargs = any(p.kind == P.VAR_KEYWORD for p in theirs)
    index = 0
    for p in mine:
        if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
            if index < len(real_positional):
                q = real_positional[index]
                if p.kind == P.POSITIONAL_OR_KEYWORD and q.name != p.name and not has_kwargs:
                    return f"parameter {index} is '{p.name}' here, '{q.name}' in cupy"
                if p.default is not P.empty and q.default is P.empty:
                    return f"'{p.name}' is optional here, required in cupy"
            elif not has_args:
                return f"takes '{p.name}' (position {index}), cupy takes {len(real_positional)} positional"
            index += 1
        elif p.kind == P.KEYWORD_ONLY:
            q = real_names.get(p.name)
            if q is None and not has_kwargs:
                return f"takes keyword '{p.name}', cupy does not"
            if q is not None and p.default is not P.empty and q.default is P.empty:
                return f"'{p.name}' is optional here, required in cupy"
        elif p.kind == P.VAR_POSITIONAL and not has_args:
            return "takes *args, cupy does not"
        elif p.kind == P.VAR_KEYWORD and not has_kwargs:
            return "takes **kwargs, cupy does not"
    for q in real_positional[index:]:
        if q.default is P.empty and not any(p.kind == P.VAR_POSITIONAL for p in mine):
            return f"cupy requires '{q.name}', the stand-in does not take it"
    return None


def stand_in_names(modules):
    """(dotted path, object) for every public name of the stand-in modules and of its classes."""
    for module_name, module in sorted(modules.items()):
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or isinstance(obj, types.ModuleType):
                continue
            yield f"{module_name}.{name}", obj
            if isinstance(obj, type) and obj.__module__.startswith("layerforge"):
                for attr, member in sorted(vars(obj).items()):
                    if not attr.startswith("_") or attr == "__init__":
                        yield f"{module_name}.{name}.{attr}", member


def main():
    report = {"layerforge_uses": used_by_layerforge(), "layerforge_uses_missing": [], "stand_in_missing": [],
              "signatures_differ": [], "signatures_unreadable": [], "checked": 0}
    for path in report["layerforge_uses"]:
        try:
            resolve(path)
        except (AttributeError, ImportError) as e:
            report["layerforge_uses_missing"].append(f"{path}: {e}")
    sys.path.insert(0, ROOT)
    from layerforge_emulator import install
    for path, ours in stand_in_names(install._build()):
        real_path = path.replace(".__init__", "")
        try:
            real = resolve(real_path)
        except (AttributeError, ImportError) as e:
            report["stand_in_missing"].append(f"{path}: {e}")
            continue
        report["checked"] += 1
        if ours is real or isinstance(ours, property) or not callable(ours) or isinstance(real, type(ours)) and not callable(real):
            continue
        if type(ours).__name__ == "ufunc" or type(real).__name__ == "ufunc":
            continue  # numpy's ufunc calling convention on both sides
        target = ours.__init__ if isinstance(ours, type) else ours
        mine = signature(target)
        if isinstance(ours, type) and isinstance(real, type):
            theirs = signature(real) if signature(real) else signature(real.__init__)
        else:
            theirs = signature(real)
        if mine is None or theirs is None:
            report["signatures_unreadable"].append(path)
            continue
        if isinstance(ours, type):
            mine = inspect.Signature([p for p in mine.parameters.values() if p.name != "self"])
        why = incompatible(mine, theirs)
        if why:
            report["signatures_differ"].append(f"{path}{mine} vs cupy {theirs}: {why}")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
