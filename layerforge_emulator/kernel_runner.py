"""The kernel executor of the emulated CUDA device: CUDA C++ text compiled with the host's g++ and run on the host.

:func:`compile_module` builds a kernel source (the same text NVRTC would compile) as C++ against
``cuda_runtime.h``, a small CUDA device header: the qualifiers, ``threadIdx`` / ``blockIdx`` / ``blockDim`` /
``gridDim``, vector types, CUDA's math functions and intrinsics, atomics, ``__syncthreads`` and the warp
operations. :meth:`KernelFunction.launch` runs a launch to its end on host memory: the device addresses a
kernel gets are host addresses (:class:`DevicePointer`), so the kernel dereferences them as it would on a GPU.

How a launch runs (runner_abi.h, runner_runtime.cpp): blocks are spread over host threads
(``LAYERFORGE_EMULATED_GPU_THREADS``, default one per core); a block's GPU threads run on one host thread as
fibers. A runner fiber starts threads one after another as plain calls, so a kernel without barriers is a
loop; a thread that reaches a barrier or a warp operation keeps the runner's stack as its own and waits, and
a new runner goes on with the next thread. ``__syncthreads`` is a real barrier over the block, warp shuffles
and votes a real exchange among the lanes their mask names. What a GPU leaves undefined is a
:class:`KernelFault` naming kernel, block and threads: a barrier some threads never reach (they exited, or
wait at another barrier), a warp operation whose mask names lanes that do not arrive or that read a lane
outside the mask, a crash (invalid address, integer division by zero, stack overflow), ``assert``.

Before a launch its configuration and arguments are checked as the device would see them: the block and
grid limits and the shared memory per block (:class:`ValueError`), and each argument against the kernel's C
signature (:class:`TypeError`): a pointer's element type against the array's dtype, a scalar's exact numpy
type against the C type (an int64 where ``int`` is declared shifts every later parameter on a device).

Sanitizers (``sanitizer="thread"`` or ``"address"``, or ``LAYERFORGE_EMULATED_GPU_SANITIZER``): the same text
is built with ``-fsanitize=thread`` / ``-fsanitize=address`` and run by a driver executable built with the
sanitizer (runner_driver.cpp), one process per launch. It gets an exact-size copy of every allocation a
:class:`DevicePointer` names (pointers into one allocation share one copy), runs the launch with every GPU
thread a fiber the sanitizer knows as a thread of its own (``__syncthreads`` orders them, nothing else; every
block on a host thread of its own), and writes the copies back. A sanitizer report (a race in shared or
global memory, an access past an allocation or a ``__shared__`` array) is a :class:`KernelFault` carrying the
report's first lines.

Compiled modules are memoised per process and kept in ``$LAYERFORGE_CACHE_DIR/emulated_gpu`` (layerforge's cache
directory, read here as layerforge reads it; ``$LAYERFORGE_EMULATED_GPU_BUILD_DIR`` names another), keyed by a hash
of the text, the options, the sanitizer, the compiler's version and the emulator's own sources.
"""
import copy
import ctypes
import functools
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple, Optional

import numpy

HERE = Path(__file__).resolve().parent
SOURCES = ("cuda_runtime.h", "runner_abi.h", "runner_runtime.cpp", "runner_driver.cpp")
SANITIZER_ENV = "LAYERFORGE_EMULATED_GPU_SANITIZER"
THREADS_ENV = "LAYERFORGE_EMULATED_GPU_THREADS"
CXX_ENV = "LAYERFORGE_EMULATED_GPU_CXX"
BUILD_DIR_ENV = "LAYERFORGE_EMULATED_GPU_BUILD_DIR"
CACHE_DIR_ENV = "LAYERFORGE_CACHE_DIR"  # the cache directory of the project that runs its kernels here
SANITIZERS = ("thread", "address")

# the device's limits (compute capability 9.0, without the opt-in to more than 48 KiB of shared memory)
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2 ** 31 - 1, 65535, 65535)
MAX_SHARED_BYTES = 48 * 1024

CXX_FLAGS = ("-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-strict-aliasing", "-ffp-contract=off",
             "-fno-exceptions", "-w")
SANITIZER_FLAGS = {"thread": ("-fsanitize=thread", "-DLF_EMU_TSAN"),
                   "address": ("-fsanitize=address", "-DLF_EMU_ASAN")}
SANITIZED_FLAGS = ("-O1", "-g", "-fno-omit-frame-pointer", "-DLF_EMU_SANITIZE")
BUILD_RECIPE = 3  # part of every cache key: bump when how artifacts are built changes
# the start of a sanitizer's report, and how many of its lines a KernelFault carries
REPORT_LINES = 24
# atexit_sleep_ms=0: ThreadSanitizer's default second of sleep at exit waits for threads still running to race;
# a sanitized launch has none then (its blocks run on the driver's thread and one it joins), so each launch paid it
SANITIZER_OPTIONS = {
    "thread": ("TSAN_OPTIONS", "halt_on_error=1:exitcode=66:report_signal_unsafe=0:history_size=3:atexit_sleep_ms=0"),
    "address": ("ASAN_OPTIONS", "halt_on_error=1:exitcode=66:detect_leaks=0:abort_on_error=0"),
}


class DevicePointer(NamedTuple):
    """A kernel's pointer argument: an address and the allocation it lies in.

    ``address`` is what the kernel gets (it may point inside the allocation); ``dtype`` the element type of
    the array it came from (None: a raw pointer, not checked against the parameter); ``base`` the first byte
    and ``size`` the bytes of the allocation (the sanitizer builds copy exactly that).
    """
    address: int
    dtype: Optional[numpy.dtype]
    base: int
    size: int

    @classmethod
    def of(cls, array):
        """The pointer to a numpy array's first element, in the allocation of the array that owns its memory."""
        owner = array
        while isinstance(owner.base, numpy.ndarray):
            owner = owner.base
        return cls(array.ctypes.data, array.dtype, owner.ctypes.data, owner.nbytes)


class Param(NamedTuple):
    """A kernel parameter: its name, its C type (``"const float*"``, ``"int"``), whether it is a pointer, and
    the numpy dtype its elements (pointer) or its value must have (None: not checked)."""
    name: str
    ctype: str
    pointer: bool
    dtype: Optional[numpy.dtype]


class KernelFault(RuntimeError):
    """A launch did what a GPU leaves undefined, or crashed; the message names kernel, block and threads."""


class CompileException(Exception):
    """A kernel source that does not compile (cupy's CompileException: the compiler's log, file:line)."""

    def __init__(self, msg, source, name, options, backend="g++"):
        self._msg = msg
        self.source = source
        self.name = name
        self.options = options
        self.backend = backend
        super().__init__(msg)

    def __reduce__(self):
        return type(self), (self._msg, self.source, self.name, self.options, self.backend)

    def get_message(self):
        return self._msg

    def dump(self, f):
        lines = self.source.split("\n")
        width = len(str(len(lines)))
        f.write(f"{self.backend} compilation of {self.name} failed: options {' '.join(self.options)}\n")
        f.write("".join(f"{i + 1:>{width}} {line}\n" for i, line in enumerate(lines)))
        f.flush()


# ---------------------------------------------------------------------------------------------------------
# The toolchain and the cache

@functools.lru_cache(maxsize=None)
def compiler():
    """``(path, identity)`` of the C++ compiler (``$LAYERFORGE_EMULATED_GPU_CXX``, else g++)."""
    path = os.environ.get(CXX_ENV) or shutil.which("g++") or shutil.which("c++")
    if not path:
        raise RuntimeError("the emulated GPU compiles kernels with g++: none found on PATH "
                           f"(or set {CXX_ENV})")
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    machine = subprocess.run([path, "-dumpmachine"], capture_output=True, text=True).stdout.strip()
    return path, f"{version} {machine}"


@functools.lru_cache(maxsize=None)
def _sources_hash():
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((HERE / name).read_bytes())
    return h.hexdigest()


_process_dir = None


def cache_dir():
    """``$LAYERFORGE_CACHE_DIR`` (None when ``off``), else ``$XDG_CACHE_HOME/layerforge`` or ``~/.cache/layerforge``:
    the directory layerforge keeps its caches in, so that one setting moves (or turns off) both."""
    given = os.environ.get(CACHE_DIR_ENV)
    if given:
        return None if given.lower() == "off" else given
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                        "layerforge")


def artifact_dir():
    """Where compiled artifacts live: ``$LAYERFORGE_EMULATED_GPU_BUILD_DIR`` when set (the tests share one per
    session while every test gets an engine cache of its own), else ``$LAYERFORGE_CACHE_DIR/emulated_gpu``, or
    a directory of this process when the cache is off."""
    global _process_dir
    root = cache_dir()
    given = os.environ.get(BUILD_DIR_ENV)
    if given or root is not None:
        path = Path(given) if given else Path(root) / "emulated_gpu"
        try:
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError:
            pass
    if _process_dir is None:
        _process_dir = Path(tempfile.mkdtemp(prefix="layerforge-emulated-gpu-"))
    return _process_dir


def _key(*parts):
    h = hashlib.sha256()
    for part in (BUILD_RECIPE, compiler()[1], _sources_hash(), CXX_FLAGS, SANITIZED_FLAGS) + parts:
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _compiler_env():
    return dict(os.environ, LC_ALL="C", LANG="C")  # plain quotes in the compiler's messages


def _run_compiler(args, source_name, source, options):
    proc = subprocess.run([compiler()[0], *args], capture_output=True, text=True, env=_compiler_env())
    if proc.returncode != 0:
        log = proc.stdout + proc.stderr
        raise CompileException(log.strip() or f"g++ exited with status {proc.returncode}", source, source_name,
                               tuple(options))


def _build(path, make):
    """``path``, made by ``make(temporary path)`` unless it exists; atomic, so processes may race for it."""
    if path.exists():
        return path
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    os.close(fd)
    try:
        make(Path(tmp))
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


_OPTION_ALIASES = {"--define-macro": "-D", "--undefine-macro": "-U", "--include-path": "-I",
                   "--pre-include": "-include"}


def gxx_options(options):
    """The g++ flags for NVRTC-style ``options``: defines, undefines, include paths, pre-includes and the C++
    standard (at least C++17, which the header needs); options that mean nothing to g++ (``-arch``,
    ``--use_fast_math``, ``-lineinfo``, ...) are dropped."""
    out, std = [], 17
    items = [str(o) for o in options]
    i = 0
    while i < len(items):
        option = items[i]
        i += 1
        name, equals, value = option.partition("=")
        if name in _OPTION_ALIASES and equals:
            option, value = _OPTION_ALIASES[name], value
        elif option in ("-D", "-U", "-I", "-include") and i < len(items):
            value = items[i]
            i += 1
        elif option.startswith(("-D", "-U", "-I")):
            option, value = option[:2], option[2:]
        elif name in ("-std", "--std"):
            digits = value.replace("c++", "").replace("gnu++", "")
            std = max(std, int(digits) if digits.isdigit() else 20)
            continue
        else:
            continue
        out += [option, value] if option == "-include" else [option + value]
    return [f"-std=c++{std}"] + out


# ---------------------------------------------------------------------------------------------------------
# Reading the text: kernels, their parameter names, the call graph

_TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|[A-Za-z_]\w*|\d[\w.]*|::|->|\S')
_NOT_NAMES = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "class", "unsigned",
              "signed", "int", "long", "short", "char", "float", "double", "bool", "void", "typename"}
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "catch", "decltype", "alignof", "static_assert",
             "__attribute__", "operator", "new", "delete", "throw", "alignas", "noexcept", "typeid"}


def _tokens(text):
    return _TOKEN.findall(text)


def _match(tokens, i, open_, close):
    """Index of the token closing the bracket at ``i``."""
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j] == open_:
            depth += 1
        elif tokens[j] == close:
            depth -= 1
            if depth == 0:
                return j
    return len(tokens) - 1


class _Kernel(NamedTuple):
    name: str        # the name the module exports (C linkage) or the identifier of a C++ kernel
    qualified: str   # how the kernel table refers to it
    c_linkage: bool
    params: tuple    # parameter names


def scan(text):
    """``(kernels, calls)`` of preprocessed text: the ``__global__`` definitions, and per function name the
    identifiers its bodies use."""
    tokens = _tokens(text)
    kernels, calls = [], {}
    scopes = []  # ("C" | "namespace NAME" | "other") per open brace
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "{":
            kind = "other"
            if i >= 2 and tokens[i - 2] == "extern" and tokens[i - 1] == '"C"':
                kind = "C"
            elif i >= 2 and tokens[i - 2] == "namespace":
                kind = "namespace " + tokens[i - 1]
            elif i >= 1 and tokens[i - 1] == "namespace":
                kind = "namespace "
            scopes.append(kind)
        elif tok == "}":
            if scopes:
                scopes.pop()
        elif tok == "(" and i >= 1 and re.match(r"[A-Za-z_]\w*$", tokens[i - 1]) and tokens[i - 1] not in _KEYWORDS:
            close = _match(tokens, i, "(", ")")
            j = close + 1
            while j < len(tokens) and tokens[j] in ("const", "noexcept", "override", "mutable", "__restrict__"):
                j += 1
            if j < len(tokens) and tokens[j] == "{" and all(s != "other" for s in scopes):
                end = _match(tokens, j, "{", "}")
                name = tokens[i - 1]
                calls.setdefault(name, set()).update(t for t in tokens[j:end] if re.match(r"[A-Za-z_]", t))
                head = _declaration_head(tokens, i - 1)
                if "__lf_emu_global__" in head:
                    c_linkage = ("extern" in head and '"C"' in head) or "C" in scopes
                    c_linkage = c_linkage and "template" not in head
                    spaces = [s.split(" ", 1)[1] for s in scopes if s.startswith("namespace ") and s != "namespace "]
                    kernels.append(_Kernel(name, "::".join(spaces + [name]), c_linkage,
                                           _param_names(tokens[i + 1:close])))
                i = end + 1
                continue
        i += 1
    return kernels, calls


def _declaration_head(tokens, name_at):
    """The tokens of a declaration before its name, back to the previous statement or brace."""
    j = name_at
    while j > 0 and tokens[j - 1] not in (";", "{", "}"):
        j -= 1
    return tokens[j:name_at]


_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "class", "typename"}


def _param_names(tokens):
    names, depth, current = [], 0, []
    for t in tokens + [","]:
        if t in ("(", "<", "["):
            depth += 1
        elif t in (")", ">", "]"):
            depth -= 1
        if t == "," and depth == 0:
            words = [x for x in current if re.match(r"[A-Za-z_]\w*$", x) and x not in _QUALIFIERS]
            if current and current != ["void"]:
                named = len(words) >= 2 and words[-1] not in _NOT_NAMES
                names.append(words[-1] if named else f"arg{len(names)}")
            current = []
        else:
            current.append(t)
    return tuple(names)


def reach(calls, name):
    """The function names ``name`` may call, itself included (by identifier: an over-estimate)."""
    seen, todo = {name}, [name]
    while todo:
        for callee in calls.get(todo.pop(), ()):
            if callee in calls and callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return seen


_EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+(?P<decl>[^;{}]*?)\s*\[\s*\]\s*;")


def rewrite_extern_shared(text):
    """``extern __shared__ T name[];`` (the launch's dynamic shared memory) as a pointer to this block's
    buffer: a local at block scope, a macro at file scope. Line numbers do not move."""
    out, last = [], 0
    for m in _EXTERN_SHARED.finditer(text):
        decl = re.sub(r"__align__\s*\(\s*\w+\s*\)|__attribute__\s*\(\(.*?\)\)", " ", m.group("decl")).strip()
        name_match = re.search(r"([A-Za-z_]\w*)\s*$", decl)
        if not name_match:
            continue
        name, ctype = name_match.group(1), decl[:name_match.start()].strip()
        pointer = f"reinterpret_cast<{ctype}*>(::lf_emu::self()->block->dynamic_shared)"
        newlines = m.group(0).count("\n")
        if _brace_depth(text, m.start()) == 0:
            line = text.count("\n", 0, m.start()) + 1
            new = f"\n#define {name} ({pointer})\n#line {line + newlines}\n"
        else:
            new = f"{ctype}* const {name} = {pointer};" + "\n" * newlines
        out += [text[last:m.start()], new]
        last = m.end()
    return "".join(out) + text[last:]


def _brace_depth(text, end):
    stripped = re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', " ", text[:end], flags=re.S)
    return stripped.count("{") - stripped.count("}")


# ---------------------------------------------------------------------------------------------------------
# C types
_C_NAMES = {"long int": "long", "long unsigned int": "unsigned long", "long long int": "long long",
            "long long unsigned int": "unsigned long long", "short int": "short", "short unsigned int":
            "unsigned short"}
_DTYPES = {"float": "float32", "double": "float64", "int": "int32", "unsigned int": "uint32", "long": "int64",
           "unsigned long": "uint64", "long long": "int64", "unsigned long long": "uint64", "short": "int16",
           "unsigned short": "uint16", "signed char": "int8", "unsigned char": "uint8", "char": "int8",
           "bool": "bool"}
_VECTOR = re.compile(r"(u?char|u?short|u?int|u?long|u?longlong|float|double)[1-4]$")
_VECTOR_DTYPES = {"char": "int8", "uchar": "uint8", "short": "int16", "ushort": "uint16", "int": "int32",
                  "uint": "uint32", "long": "int64", "ulong": "uint64", "longlong": "int64", "ulonglong": "uint64",
                  "float": "float32", "double": "float64"}


def c_type(base, pointer_depth, is_const):
    """The C spelling of a parameter type from the compiler's name of its base type."""
    base = _C_NAMES.get(base, base)
    return ("const " if is_const else "") + base + "*" * pointer_depth


def param_dtype(base, pointer_depth):
    """The numpy dtype a parameter's value (or, for a pointer, its elements) must have; None: unchecked."""
    base = _C_NAMES.get(base, base)
    if pointer_depth > 1:
        return None
    if base in _DTYPES:
        return numpy.dtype(_DTYPES[base])
    vector = _VECTOR.match(base)
    if vector and pointer_depth == 1:
        return numpy.dtype(_VECTOR_DTYPES[vector.group(1)])
    return None


def _compatible(param, dtype):
    if param.dtype is None or dtype is None:
        return True
    if numpy.dtype(dtype) == param.dtype:
        return True
    return param.ctype.replace("const ", "") == "char*" and numpy.dtype(dtype) in (numpy.int8, numpy.uint8)


# ---------------------------------------------------------------------------------------------------------
# The runtime library, and modules

class _ParamInfo(ctypes.Structure):
    _fields_ = [("base", ctypes.c_char_p), ("pointer_depth", ctypes.c_uint), ("is_const", ctypes.c_uint),
                ("size", ctypes.c_uint)]


class _KernelInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("nparams", ctypes.c_uint), ("params", ctypes.POINTER(_ParamInfo)),
                ("run", ctypes.c_void_p)]


class _LaunchDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("run", ctypes.c_void_p), ("args", ctypes.c_void_p),
                ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("dynamic_shared", ctypes.c_ulonglong),
                ("host_threads", ctypes.c_int), ("touch_shared", ctypes.c_void_p)]


_lock = threading.RLock()
_runtime_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def runtime():
    """The emulator's runtime library (runner_runtime.cpp), built once per machine and loaded once."""
    path = artifact_dir() / f"runtime-{_key('runtime')}.so"
    with _runtime_lock:
        _build(path, lambda out: _run_compiler(
            ["-std=c++17", *CXX_FLAGS, str(HERE / "runner_runtime.cpp"), "-o", str(out), "-lpthread"],
            "runner_runtime.cpp", (HERE / "runner_runtime.cpp").read_text(), ()))
        lib = ctypes.CDLL(str(path))
    lib.lf_emu_api.restype = ctypes.c_void_p
    lib.lf_emu_launch.argtypes = [ctypes.POINTER(_LaunchDesc), ctypes.c_char_p, ctypes.c_size_t]
    lib.lf_emu_launch.restype = ctypes.c_int
    return lib


def host_threads():
    """How many host threads run a launch's blocks: ``$LAYERFORGE_EMULATED_GPU_THREADS``, else the cores."""
    given = os.environ.get(THREADS_ENV)
    if given:
        return max(1, int(given))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_sanitizer():
    """The sanitizer ``$LAYERFORGE_EMULATED_GPU_SANITIZER`` asks for: "thread", "address" or None."""
    value = os.environ.get(SANITIZER_ENV, "").strip().lower()
    if value in ("", "0", "none", "off", "no"):
        return None
    if value not in SANITIZERS:
        raise ValueError(f"{SANITIZER_ENV}={value!r}: expected 'thread', 'address' or nothing")
    return value


_modules = {}


def compile_module(code, options=(), name_expressions=(), sanitizer=None):
    """Compile CUDA C++ ``code`` for the emulated device (memoised on its arguments).

    Args:
        code: the kernel source, as NVRTC would get it.
        options: NVRTC-style options (``-D...``, ``-U...``, ``-I...``, ``-std=...``); ones that mean nothing
            to g++ are dropped.
        name_expressions: C++ expressions naming kernels to make reachable by that text (template kernels,
            as cupy's ``name_expressions``).
        sanitizer: None, "thread" or "address"; None takes ``$LAYERFORGE_EMULATED_GPU_SANITIZER``.

    Returns:
        a :class:`CompiledModule`.

    Raises:
        CompileException: the compiler's errors, with file:line.
    """
    sanitizer = sanitizer if sanitizer is not None else default_sanitizer()
    if sanitizer is not None and sanitizer not in SANITIZERS:
        raise ValueError(f"sanitizer {sanitizer!r}: expected 'thread', 'address' or None")
    return _compile(code, tuple(options), tuple(name_expressions), sanitizer)


_building = {}  # memo key -> the lock its one build holds: different modules compile in parallel


def _compile(code, options, name_expressions, sanitizer):
    memo = (code, options, name_expressions, sanitizer)
    with _lock:
        module = _modules.get(memo)
        if module is not None:
            return module
        building = _building.setdefault(memo, threading.Lock())
    with building:
        module = _modules.get(memo)
        if module is None:
            # a sanitized module takes its kernels' signatures from the plain build of the same text
            native = None if sanitizer is None else _compile(code, options, name_expressions, None)
            module = CompiledModule(code, options, name_expressions, sanitizer, native)
            with _lock:
                _modules[memo] = module
    return module


class CompiledModule:
    """A compiled kernel source: its kernels by name (and by name expression)."""

    def __init__(self, code, options, name_expressions, sanitizer, native=None):
        self.code, self.options, self.name_expressions, self.sanitizer = code, options, name_expressions, sanitizer
        self._sanitized = None  # (driver, sanitized module): built on the first launch
        self._sanitized_lock = threading.Lock()
        if native is not None:
            self.path, self.source, self._lib = native.path, native.source, native._lib
            self._functions = {name: f.bound_to(self) for name, f in native._functions.items()}
            return
        flags = gxx_options(options)
        text = rewrite_extern_shared(code)
        key = _key(text, flags, name_expressions)
        directory = artifact_dir()
        source = directory / f"kernel-{key}.cu"
        kernels, calls = scan(self._preprocess(text, flags, source))
        table = [(k.qualified, k.name) for k in kernels if k.c_linkage]
        table += [(expression, expression) for expression in name_expressions]
        full = text + "\n" + _kernel_table(table)
        if not source.exists():
            _build(source, lambda out: out.write_text(full))
        compile_args = [*flags, f"-I{HERE}", "-include", "cuda_runtime.h", "-x", "c++", str(source)]
        path = directory / f"kernel-{key}.so"
        _build(path, lambda out: _run_compiler([*CXX_FLAGS, *compile_args, "-o", str(out)], str(source), code,
                                               options))
        self.path, self.source = path, source
        self._lib = ctypes.CDLL(str(path))
        self._lib.lf_emu_module_init(ctypes.c_void_p(runtime().lf_emu_api()))
        self._lib.lf_emu_kernel.restype = ctypes.POINTER(_KernelInfo)
        shared = _static_shared(path, kernels, calls)
        names = {k.name: k.params for k in kernels}
        self._functions = {}
        for index, (_, name) in enumerate(table):
            info = self._lib.lf_emu_kernel(index).contents
            base_name = re.split(r"[<(\s]", name.split("::")[-1])[0]
            param_names = names.get(name) or names.get(base_name) or ()
            params = []
            for p in range(info.nparams):
                pi = info.params[p]
                base = _pretty_type(pi.base.decode())
                pname = param_names[p] if p < len(param_names) else f"arg{p}"
                params.append((Param(pname, c_type(base, pi.pointer_depth, pi.is_const), pi.pointer_depth > 0,
                                     param_dtype(base, pi.pointer_depth)), pi.size))
            self._functions[name] = KernelFunction(self, name, params, info.run, shared.get(name, 0))

    def _preprocess(self, text, flags, source):
        proc = subprocess.run([compiler()[0], "-E", "-P", "-x", "c++", *flags, f"-I{HERE}", "-DLF_EMU_DISCOVER",
                               "-include", "cuda_runtime.h", "-"], input=text, capture_output=True, text=True,
                              env=_compiler_env())
        if proc.returncode != 0:
            raise CompileException(proc.stderr.strip().replace("<stdin>", str(source)), self.code, str(source),
                                   self.options)
        return proc.stdout

    def function(self, name):
        """The kernel ``name`` (an ``extern "C"`` name, or one of the module's name expressions)."""
        try:
            return self._functions[name]
        except KeyError:
            known = ", ".join(sorted(self._functions)) or "none"
            raise LookupError(f"no kernel named {name!r} in this module (its kernels: {known})") from None

    @property
    def names(self):
        """The names :meth:`function` knows."""
        return tuple(self._functions)

    def sanitized_executable(self):
        """The driver executable with this module's sanitized build linked in (built on first use)."""
        with self._sanitized_lock:
            if self._sanitized is None:
                self._sanitized = _sanitized_driver(self)
        return self._sanitized


def _pretty_type(pretty):
    m = re.search(r"\[with T = (.*?)(?:;|\]$)", pretty)
    return m.group(1).strip() if m else pretty


def _kernel_table(table):
    entries = ", ".join(f'LF_EMU_KERNEL_INFO({ref}, "{name}")' for ref, name in table)
    dummy = "" if table else '{"", 0, nullptr, nullptr}'
    return (f'#line 1 "emulator-kernel-table"\n'
            f'extern "C" __attribute__((visibility("default"))) unsigned lf_emu_kernel_count() '
            f'{{ return {len(table)}; }}\n'
            f'extern "C" __attribute__((visibility("default"))) const lf_emu::KernelInfo* lf_emu_kernel(unsigned i) '
            f'{{\n    static const lf_emu::KernelInfo table[] = {{{entries}{dummy}}};\n    return &table[i];\n}}\n')


_SYMBOL = re.compile(r"^\s*\d+:\s+[0-9a-f]+\s+(\d+)\s+TLS\s+\w+\s+\w+\s+\w+\s+(.+)$")


def _static_shared(path, kernels, calls):
    """Static ``__shared__`` bytes per kernel: the thread-local variables of the build (``__shared__`` is
    ``static thread_local`` there), each counted for the kernels that reach the function declaring it."""
    out = {k.name: 0 for k in kernels}
    try:
        listing = subprocess.run(["readelf", "-sW", "-C", str(path)], capture_output=True, text=True).stdout
    except OSError:
        return out
    reaches = {k.name: reach(calls, k.name) for k in kernels}
    for line in listing.splitlines():
        m = _SYMBOL.match(line)
        if not m or m.group(2).startswith("lf_emu_"):
            continue
        size, symbol = int(m.group(1)), m.group(2)
        owner_path = symbol.rsplit("::", 1)[0] if "::" in symbol else ""
        named = [k for k in out if re.search(rf"\b{re.escape(k)}::", owner_path)]
        if not named:
            owner = re.match(r"[\w\s*&]*?([A-Za-z_]\w*)\s*[<(]", owner_path + "(")
            owner = owner.group(1) if owner and owner_path else symbol
            named = [k for k in out if owner in reaches[k] or owner in calls.get(k, ())]
        for k in named:
            out[k] += size
    return out


# ---------------------------------------------------------------------------------------------------------
# Launches

def _dims(value, what, limits):
    if isinstance(value, int) or isinstance(value, numpy.integer):
        value = (value,)
    try:
        dims = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{what} must be an int or a tuple of up to 3 ints, got {value!r}") from None
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} {value!r}: 1 to 3 dimensions")
    dims += (1,) * (3 - len(dims))
    for axis, (n, limit) in enumerate(zip(dims, limits)):
        if not 1 <= n <= limit:
            raise ValueError(f"{what} {dims}: dimension {'xyz'[axis]} is {n}, the device allows 1 to {limit} "
                             "(CUDA: invalid configuration argument)")
    return dims


class KernelFunction:
    """One kernel of a :class:`CompiledModule`.

    Attributes:
        name: the kernel's name (or name expression).
        params: its parameters, :class:`Param` each, as the compiler sees its C signature.
        static_shared_bytes: bytes of ``__shared__`` variables it may use.
    """
    max_threads_per_block = MAX_THREADS_PER_BLOCK

    def __init__(self, module, name, params, run, static_shared_bytes):
        self.module = module
        self.name = name
        self.params = tuple(p for p, _ in params)
        self._sizes = tuple(size for _, size in params)
        self._offsets, total = [], 0
        for size in self._sizes:
            self._offsets.append(total)
            total += (max(size, 1) + 7) // 8 * 8
        self._bytes = max(total, 8)
        self._run = run
        self.static_shared_bytes = static_shared_bytes

    def bound_to(self, module):
        """This kernel as a kernel of ``module`` (the same text built another way)."""
        out = copy.copy(self)
        out.module = module
        return out

    def __repr__(self):
        return f"<emulated kernel {self.name}({', '.join(f'{p.ctype} {p.name}' for p in self.params)})>"

    def check_launch(self, grid, block, shared_mem):
        """``(grid, block)`` as 3-tuples, after checking them and the shared memory against the device's
        limits (ValueError)."""
        grid = _dims(grid, "grid", MAX_GRID_DIM)
        block = _dims(block, "block", MAX_BLOCK_DIM)
        threads = block[0] * block[1] * block[2]
        if threads > MAX_THREADS_PER_BLOCK:
            raise ValueError(f"kernel {self.name}: block {block} has {threads} threads, the device allows "
                             f"{MAX_THREADS_PER_BLOCK} (CUDA: invalid configuration argument)")
        if int(shared_mem) < 0:
            raise ValueError(f"kernel {self.name}: shared_mem {shared_mem} is negative")
        if self.static_shared_bytes + int(shared_mem) > MAX_SHARED_BYTES:
            raise ValueError(f"kernel {self.name}: {self.static_shared_bytes} bytes of static and {shared_mem} of "
                             f"dynamic shared memory exceed the {MAX_SHARED_BYTES} a block may use "
                             "(CUDA: invalid argument)")
        return grid, block

    def check_args(self, args):
        """Each argument against its parameter, as the device would read it (TypeError names both)."""
        args = tuple(args)
        if len(args) != len(self.params):
            raise TypeError(f"kernel {self.name} takes {len(self.params)} arguments "
                            f"({', '.join(p.name for p in self.params)}), got {len(args)}")
        for index, (p, size, a) in enumerate(zip(self.params, self._sizes, args)):
            where = f"kernel {self.name}, parameter {index} '{p.name}' ({p.ctype})"
            if p.pointer:
                if a is None:
                    continue
                if not isinstance(a, DevicePointer):
                    raise TypeError(f"{where}: expects a device pointer, got {type(a).__name__} {a!r:.60}")
                if not _compatible(p, a.dtype):
                    raise TypeError(f"{where}: got a pointer to {numpy.dtype(a.dtype).name} data; the kernel reads "
                                    f"{p.dtype.name} elements there")
            elif isinstance(a, DevicePointer):
                raise TypeError(f"{where}: expects a value, got a device pointer")
            elif not isinstance(a, numpy.generic):
                raise TypeError(f"{where}: expects a numpy scalar of its type, got {type(a).__name__} {a!r:.60}")
            elif p.dtype is not None and a.dtype != p.dtype:
                raise TypeError(f"{where}: got numpy.{a.dtype.name} ({a.dtype.itemsize} bytes); the device reads "
                                f"{size} bytes of {p.ctype} there, so this and every later parameter would be "
                                f"read wrong. Pass numpy.{p.dtype.name}")
            elif p.dtype is None and a.dtype.itemsize != size:
                raise TypeError(f"{where}: got {a.dtype.itemsize} bytes, the parameter has {size}")
        return args

    def launch(self, grid, block, args, shared_mem=0):
        """Run the kernel to completion on ``grid`` x ``block`` threads.

        Args:
            grid, block: int or tuples of up to 3 ints.
            args: a :class:`DevicePointer` (or None, a null pointer) for each pointer parameter, a numpy scalar
                of the exact C type for each value parameter.
            shared_mem: bytes of dynamic shared memory (``extern __shared__``) per block.

        Raises:
            TypeError: an argument's count or C type does not match the signature.
            ValueError: the launch exceeds the device's limits.
            KernelFault: the kernel did what a GPU leaves undefined, crashed, or a sanitizer reported it.
        """
        grid, block = self.check_launch(grid, block, shared_mem)
        args = self.check_args(args)
        if self.module.sanitizer is not None:
            return _launch_sanitized(self, grid, block, args, int(shared_mem))
        buffer = ctypes.create_string_buffer(self._bytes)
        base = ctypes.addressof(buffer)
        for p, offset, a in zip(self.params, self._offsets, args):
            if p.pointer:
                struct.pack_into("<Q", buffer, offset, 0 if a is None else int(a.address))
            else:
                data = a.tobytes()
                ctypes.memmove(base + offset, data, len(data))
        pointers = (ctypes.c_void_p * max(len(args), 1))(*[base + o for o in self._offsets])
        desc = _LaunchDesc(self.name.encode(), self._run, ctypes.cast(pointers, ctypes.c_void_p), grid, block,
                           int(shared_mem), host_threads(), None)
        error = ctypes.create_string_buffer(8192)
        if runtime().lf_emu_launch(ctypes.byref(desc), error, len(error)) != 0:
            raise KernelFault(error.value.decode(errors="replace"))


# ---------------------------------------------------------------------------------------------------------
# Sanitized launches: one driver process each

@functools.lru_cache(maxsize=None)
def _driver(sanitizer):
    """The driver executable of one sanitizer: runner_driver.cpp and the runtime, not instrumented themselves,
    linked with the sanitizer's runtime library (which the sanitized modules it loads need)."""
    flags = ["-std=c++17", "-O1", "-g", "-DLF_EMU_SANITIZE", *SANITIZER_FLAGS[sanitizer][1:]]
    path = artifact_dir() / f"driver-{sanitizer}-{_key('driver', sanitizer)}"

    def make(out):
        objects = []
        for name in ("runner_driver.cpp", "runner_runtime.cpp"):
            objects.append(str(out) + "." + name + ".o")
            _run_compiler([*flags, "-c", str(HERE / name), "-o", objects[-1]], name, (HERE / name).read_text(), ())
        try:
            _run_compiler(["-fsanitize=" + sanitizer, *objects, "-o", str(out), "-ldl", "-lpthread"], "driver", "", ())
        finally:
            for o in objects:
                os.unlink(o)
    return _build(path, make)


def _sanitized_driver(module):
    """``(driver executable, sanitized module)`` for a module."""
    sanitizer = module.sanitizer
    flags = gxx_options(module.options)
    source = module.source
    path = module.path.with_name(module.path.stem + f"-{sanitizer}.so")
    _build(path, lambda out: _run_compiler(
        ["-fPIC", "-shared", "-fvisibility=hidden", "-fno-strict-aliasing", "-ffp-contract=off", "-w",
         *SANITIZED_FLAGS, *SANITIZER_FLAGS[sanitizer], *flags, f"-I{HERE}", "-include", "cuda_runtime.h",
         "-x", "c++", str(source), "-o", str(out)], str(source), module.code, module.options))
    return _driver(sanitizer), path


def _request(kernel, grid, block, args, shared_mem):
    """The driver's request for a launch, and the allocations ``[(base, size)]`` in the order it copies them."""
    allocations = {}
    for a in args:
        if isinstance(a, DevicePointer) and a.address != 0:
            allocations[a.base] = max(allocations.get(a.base, 0), int(a.size))
    order = list(allocations)
    index = {b: i for i, b in enumerate(order)}
    name = kernel.name.encode()
    parts = [b"LFEMU001", struct.pack("<I", len(name)), name, struct.pack("<3I", *grid), struct.pack("<3I", *block),
             struct.pack("<Q", shared_mem), struct.pack("<I", len(order))]
    for b in order:
        parts += [struct.pack("<Q", allocations[b]), ctypes.string_at(b, allocations[b])]
    parts.append(struct.pack("<I", len(args)))
    for p, a in zip(kernel.params, args):
        if not p.pointer:
            data = a.tobytes()
            parts += [struct.pack("<II", 0, len(data)), data]
        elif a is None or a.address == 0:
            parts.append(struct.pack("<I", 2))
        else:
            parts.append(struct.pack("<IIq", 1, index[a.base], int(a.address) - a.base))
    return b"".join(parts), [(b, allocations[b]) for b in order]


_FRAME = re.compile(r"^\s*#(\d+) (?:0x[0-9a-f]+ in )?(.*?)(?: (\S+:\d+)(?::\d+)?)?(?: \(\S*\))?$")
# where the memory of a report's "Location" / "allocated by" came from, by the frames that made it
_ORIGINS = (("dl-tls.c", "the block's __shared__ memory"),
            ("run_block", "the block's dynamic shared memory (extern __shared__)"),
            ("runner_driver.cpp", "the allocation a kernel argument points into"))
_THREAD_NAME = re.compile(r"^\s*Thread (T\d+) '([^']*)'")


def _short_function(name):
    """``tiled_product<...>(...)::<lambda...>`` as ``tiled_product``: the identifier path without template
    arguments and parameters."""
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).split()[-1] if "".join(out).split() else name


_GLOBAL = re.compile(r"global variable '(\w+)' defined in '[^']*:(\d+):\d+' \(0x[0-9a-f]+\)")


def sanitizer_report(stderr, kernel_name, sanitizer, code=""):
    """The gist of a sanitizer's report in ``stderr`` (what was accessed where, by which GPU thread, in the
    kernel's own frames), or None when there is none. ``code``: the kernel's text, to tell its ``__shared__``
    arrays (globals in the AddressSanitizer build) from its other globals."""
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if "WARNING: ThreadSanitizer" in line
                  or "ERROR: AddressSanitizer" in line), None)
    if start is None:
        return None
    names = dict(m.groups() for m in map(_THREAD_NAME.match, lines) if m)
    kind = lines[start].split("Sanitizer: ", 1)[1].split(" (pid")[0].split(" on address")[0]
    out, frames, pending = [], 0, None
    for line in lines[start + 1:]:
        if line.startswith(("SUMMARY:", "  Thread T", "Thread T", "Shadow bytes")):
            break
        frame = _FRAME.match(line)
        if frame:
            function, where = frame.group(2), frame.group(3) or ""
            origin = next((o for marker, o in _ORIGINS if marker in where or marker in function), None)
            if origin is not None and pending is not None:
                out[pending] = f"  Location: {origin}"
                pending = None
            elif frames < 3 and where and not where.startswith(("../", "/usr/")) and "libsanitizer" not in where \
                    and not any(n in where for n in ("runner_", "cuda_runtime.h", "emulator-kernel-table")):
                out.append(f"    {_short_function(function)} at {where}")
                frames += 1
            continue
        text = line.strip()
        if text and not text.startswith(("0x0", "=>", "[failed")) and "lf_emu_" not in text:
            for tid, name in names.items():
                text = re.sub(rf"\bthread {tid}\b", name, text)
            text = re.sub(r" (at 0x[0-9a-f]+) thread T\d+$", r" \1", text)  # AddressSanitizer: the host thread
            text = _GLOBAL.sub(lambda m: _global_name(m, code), text)
            pending = len(out) if text.startswith(("Location is heap block", "allocated by")) else None
            out.append("  " + text)
            frames = 0
    running = [line.split("made by ", 1)[1].strip() for line in lines if "the report's access was made by" in line]
    tool = "ThreadSanitizer" if sanitizer == "thread" else "AddressSanitizer"
    head = f"{running[0] if running else f'kernel {kernel_name}'}: {tool}: {kind}"
    return "\n".join([head] + out[:REPORT_LINES])


def _global_name(match, code):
    name, line = match.group(1), int(match.group(2))
    lines = code.splitlines()
    kind = "__shared__ array" if 0 < line <= len(lines) and "__shared__" in lines[line - 1] else "global variable"
    return f"{kind} '{name}' (line {line})"


def _launch_sanitized(kernel, grid, block, args, shared_mem):
    driver, module = kernel.module.sanitized_executable()
    request, allocations = _request(kernel, grid, block, args, shared_mem)
    variable, options = SANITIZER_OPTIONS[kernel.module.sanitizer]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env[variable] = options + (":" + os.environ[variable] if os.environ.get(variable) else "")
    with tempfile.TemporaryDirectory(prefix="layerforge-launch-") as tmp:
        request_path, response_path = Path(tmp) / "request", Path(tmp) / "response"
        request_path.write_bytes(request)
        proc = subprocess.run([str(driver), str(module), str(request_path), str(response_path)], env=env,
                              capture_output=True, text=True, errors="replace")
        if proc.stdout:  # the kernel's printf
            sys.stdout.write(proc.stdout)
        report = sanitizer_report(proc.stderr, kernel.name, kernel.module.sanitizer, kernel.module.code)
        if report is not None:
            raise KernelFault(report)
        if proc.returncode != 0 or not response_path.exists():
            tail = "\n".join(proc.stderr.strip().splitlines()[-REPORT_LINES:])
            raise KernelFault(f"kernel {kernel.name}: the sanitized launch ended with status {proc.returncode}:\n"
                              f"{tail}")
        response = response_path.read_bytes()
    status, length = struct.unpack_from("<II", response)
    if status != 0:
        raise KernelFault(response[8:8 + length].decode(errors="replace"))
    at = 8 + length
    for base, size in allocations:
        ctypes.memmove(base, response[at:at + size], size)
        at += size
