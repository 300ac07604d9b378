"""``python3 -c PROGRAM`` in a simulated image: a small Python, run from the program's AST.

Why not a regex: the console asks an image about itself with a real program
(:func:`sparkconsole.deploy.engines.engine_program`), and people type their own
(``python3 -c "import vllm; print(vllm.__version__)"``). A twin that answers any text with the
engine check's lines hides typos, missing modules and programs that would crash. So the program is
parsed by Python's own compiler (a syntax error is reported exactly as CPython reports it: ``File
"<string>", line N``, the line, the caret, ``SyntaxError: …``, exit 1) and then *evaluated* by
walking the AST over a small, safe subset; nothing of the program ever runs on the host.

The subset: assignments, ``if``/``elif``/``else``, ``for`` and ``while`` (a step budget), ``try``/
``except``/``else``/``finally``, ``raise``, ``import X[.Y] [as Z]``, ``from X import Y``, calls, the
usual operators (``%`` formatting, ``in``, comparisons, ``and``/``or``/``not``, conditional
expressions), f-strings, subscripts, comprehensions, and the builtins and ``str``/``list``/``dict``/
``set`` methods a probe uses (``print``, ``len``, ``set``, ``sorted``, ``getattr``, ``' '.join`` …).

What the image has is :class:`PyContext`: its packages with their ``__version__`` (a package it
lacks: ``ModuleNotFoundError: No module named 'X'`` with CPython's traceback, exit 1, unless a
``try``/``except`` catches it), its commands on PATH (``shutil.which``), torch's CUDA build
(``torch.version.cuda``, ``torch.cuda.get_arch_list()``: empty without a GPU, as torch returns it)
and the GPU the container was given (``torch.cuda.is_available()`` only with ``--gpus``;
``get_device_capability()`` ``(12, 1)`` on GB10, else torch's "Found no NVIDIA driver" error), and
the model registries of vLLM and SGLang. A name or attribute outside that raises as Python would
(``NameError``/``AttributeError``, with CPython 3.12's "Did you mean" suggestion); a construct or
standard module the simulator does not model (``def``, ``lambda``, ``subprocess`` …) stops with a
``sparksim:`` line on stderr and exit 1 rather than a made-up answer.
"""

from __future__ import annotations

import ast
import builtins as _builtins
import json as _json
import operator
import posixpath
import sys as _sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SITE = "/usr/local/lib/python3.12/dist-packages"
PY_VERSION = "3.12.3"  # the vLLM images' Python (Ubuntu's python3.12; their dist-packages paths say 3.12)
NO_DRIVER = ("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
             "driver from http://www.nvidia.com/Download/index.aspx")  # torch/cuda/__init__.py _lazy_init
MAX_STEPS = 200_000
MAX_LEN = 1_000_000  # the longest str/list a program may build (a runaway program stops here)
MAX_ALLOC = 32_000_000  # all it may build together (items of the strings and lists it makes)


@dataclass
class PyContext:
    """What the image's Python sees: its packages and commands, torch's build, the GPU, the env."""

    packages: dict[str, str]  # importable top-level package -> __version__ ("" when not modelled)
    commands: dict[str, str] = field(default_factory=dict)  # name -> path on PATH (shutil.which)
    cuda: str | None = None  # torch.version.cuda
    cuda_archs: tuple[str, ...] = ()  # torch.cuda.get_arch_list() when a GPU is visible
    gpu: tuple[int, int] | None = None  # the visible GPU's compute capability (None: no GPU given)
    gpu_name: str = "NVIDIA GB10"
    vllm_archs: tuple[str, ...] = ()  # vllm ModelRegistry.get_supported_archs()
    sglang_archs: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=lambda: ["-c"])
    modelled: frozenset[str] = frozenset({"vllm", "transformers", "torch", "sglang", "ray"})


# ---- Python's exceptions, as values ------------------------------------------------------------

_BASES = {
    "BaseException": None, "Exception": "BaseException", "SystemExit": "BaseException",
    "KeyboardInterrupt": "BaseException", "ImportError": "Exception", "ModuleNotFoundError": "ImportError",
    "NameError": "Exception", "UnboundLocalError": "NameError", "AttributeError": "Exception",
    "TypeError": "Exception", "ValueError": "Exception", "LookupError": "Exception", "KeyError": "LookupError",
    "IndexError": "LookupError", "ArithmeticError": "Exception", "ZeroDivisionError": "ArithmeticError",
    "OverflowError": "ArithmeticError", "RuntimeError": "Exception", "NotImplementedError": "RuntimeError",
    "RecursionError": "RuntimeError", "OSError": "Exception", "FileNotFoundError": "OSError",
    "AssertionError": "Exception", "StopIteration": "Exception", "MemoryError": "Exception",
    "UnicodeError": "ValueError", "json.decoder.JSONDecodeError": "ValueError",
    "importlib.metadata.PackageNotFoundError": "ImportError",
}


class PyError(Exception):
    """A Python exception raised inside the program (``etype``: its class name)."""

    def __init__(self, etype: str, msg: str = "", args: tuple = ()) -> None:
        super().__init__(msg)
        self.etype = etype
        self.msg = msg
        self.pyargs = args if args else ((msg,) if msg else ())
        self.lineno: int | None = None
        self.name: str | None = None  # ImportError.name


class NotModelled(Exception):
    """The program uses something the simulator does not evaluate."""


class _Exit(Exception):
    def __init__(self, code: object) -> None:
        self.code = code


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


def _is_a(etype: str, base: str) -> bool:
    t: str | None = etype
    while t is not None:
        if t == base:
            return True
        t = _BASES.get(t, "Exception")
    return False


@dataclass(frozen=True)
class ExcClass:
    name: str

    def __repr__(self) -> str:
        return f"<class '{self.name}'>"


@dataclass
class ExcValue:
    """A caught exception (``except E as e``)."""

    etype: str
    msg: str
    args: tuple

    def __str__(self) -> str:
        return self.msg if len(self.args) != 1 else str(self.args[0])

    def __repr__(self) -> str:
        return f"{self.etype}({', '.join(repr(a) for a in self.args)})"


class Obj:
    """A module or an object of the image's packages: named attributes, nothing else."""

    def __init__(self, name: str, attrs: dict[str, Any] | None = None, kind: str = "module",
                 opaque: bool = False, cls: str = "") -> None:
        self.name = name
        self.attrs = dict(attrs or {})
        self.kind = kind
        self.opaque = opaque  # a real package the simulator does not model: any use stops the program
        self.cls = cls

    def __repr__(self) -> str:
        if self.kind == "module":
            if "." in self.name or self.name in _sys.stdlib_module_names:
                return f"<module '{self.name}'>"
            return f"<module '{self.name}' from '{SITE}/{self.name}/__init__.py'>"
        return f"<{self.name} object at 0xffff8c2b5e50>"

    __str__ = __repr__


class Func:
    """A callable the program may call (a builtin, a module's function, a bound method)."""

    def __init__(self, name: str, fn: Callable[..., Any], kind: str = "builtin") -> None:
        self.name = name
        self.fn = fn
        self.kind = kind

    def __call__(self, *args: Any, **kw: Any) -> Any:
        return self.fn(*args, **kw)

    def __repr__(self) -> str:
        if self.kind == "builtin":
            return f"<built-in function {self.name}>"
        return f"<function {self.name} at 0xffff8c2b1da0>"

    __str__ = __repr__


@dataclass(frozen=True)
class PyType:
    """``type(x)`` of a plain value: enough for ``type(e).__name__``."""

    name: str

    def __repr__(self) -> str:
        return f"<class '{self.name}'>"


_PLAIN = (str, bytes, int, float, complex, bool, type(None), tuple, list, set, frozenset, dict, range,
          type({}.keys()), type({}.values()), type({}.items()))

# methods of plain values a program may call (everything else is an AttributeError, as Python says
# for a missing one, or "not modelled")
_METHODS: dict[type, frozenset[str]] = {
    str: frozenset({"join", "split", "rsplit", "strip", "lstrip", "rstrip", "startswith", "endswith", "replace",
                    "lower", "upper", "title", "splitlines", "partition", "rpartition", "count", "find", "rfind",
                    "index", "isdigit", "isalpha", "isalnum", "isspace", "zfill", "ljust", "rjust", "center",
                    "removeprefix", "removesuffix", "casefold", "capitalize", "islower", "isupper"}),
    list: frozenset({"append", "extend", "index", "count", "pop", "insert", "remove", "copy", "reverse", "sort",
                     "clear"}),
    tuple: frozenset({"index", "count"}),
    dict: frozenset({"get", "keys", "values", "items", "setdefault", "update", "pop", "copy", "clear"}),
    set: frozenset({"add", "update", "union", "intersection", "difference", "issubset", "issuperset", "discard",
                    "remove", "pop", "copy", "isdisjoint", "symmetric_difference", "clear"}),
    frozenset: frozenset({"union", "intersection", "difference", "issubset", "issuperset", "isdisjoint", "copy"}),
    bytes: frozenset({"decode", "startswith", "endswith", "strip", "split"}),
}
_WIDTH_METHODS = {"zfill", "ljust", "rjust", "center"}


# ---- CPython 3.12's "Did you mean" (Lib/traceback.py: _compute_suggestion_error) -----------------

_MOVE_COST, _CASE_COST, _MAX_STRING = 2, 1, 40


def _distance(a: str, b: str, max_cost: int) -> int:
    if a == b:
        return 0
    if len(a) > _MAX_STRING or len(b) > _MAX_STRING:
        return max_cost + 1
    prev = [i * _MOVE_COST for i in range(len(b) + 1)]
    for i, ca in enumerate(a, 1):
        cur = [i * _MOVE_COST] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            sub = 0 if ca == cb else (_CASE_COST if ca.lower() == cb.lower() else _MOVE_COST)
            cur[j] = min(prev[j] + _MOVE_COST, cur[j - 1] + _MOVE_COST, prev[j - 1] + sub)
        prev = cur
    return prev[-1]


def suggestion(wrong: str, candidates: list[str]) -> str | None:
    if len(candidates) > 750:
        return None
    best: str | None = None
    best_d = 0
    for cand in candidates:
        if cand == wrong:
            continue
        max_d = (len(cand) + len(wrong) + 3) * _MOVE_COST // 6
        if best is not None:
            max_d = min(max_d, best_d - 1)
        d = _distance(wrong, cand, max_d)
        if d > max_d:
            continue
        if best is None or d < best_d:
            best, best_d = cand, d
    return best


# ---- the evaluator ---------------------------------------------------------------------------


class Machine:
    """One run of one program."""

    def __init__(self, ctx: PyContext) -> None:
        self.ctx = ctx
        self.out: list[str] = []
        self.err: list[str] = []
        self.size = 0
        self.steps = 0
        self.alloc = 0
        self.scopes: list[dict[str, Any]] = [{"__name__": "__main__"}]
        self.modules: dict[str, Obj] = {}
        self.stdout = Obj("_io.TextIOWrapper", {"write": Func("write", lambda s: self._write(self.out, s))},
                          kind="object")
        self.stderr = Obj("_io.TextIOWrapper", {"write": Func("write", lambda s: self._write(self.err, s))},
                          kind="object")
        self.builtins = self._make_builtins()
        self._table: dict[str, Obj] | None = None

    # -- output --
    def _write(self, stream: list[str], s: Any) -> int:
        if not isinstance(s, str):
            raise PyError("TypeError", f"write() argument must be str, not {_tname(s)}")
        self.size += len(s)
        if self.size > MAX_LEN:
            raise NotModelled("an output this large")
        stream.append(s)
        return len(s)

    def _print(self, *args: Any, sep: Any = " ", end: Any = "\n", file: Any = None, flush: bool = False) -> None:
        sep = " " if sep is None else sep
        end = "\n" if end is None else end
        text = sep.join(self._str(a) for a in args) + end
        stream = self.err if file is self.stderr else self.out
        if file is not None and file not in (self.stdout, self.stderr):
            raise NotModelled("print(file=...) to anything but sys.stdout/sys.stderr")
        self._write(stream, text)

    def _str(self, v: Any) -> str:
        return str(v)

    # -- builtins --
    def _make_builtins(self) -> dict[str, Any]:
        def getattr_(obj: Any, name: str, *default: Any) -> Any:
            try:
                return self.getattr(obj, name)
            except PyError as e:
                if default and e.etype == "AttributeError":
                    return default[0]
                raise

        def hasattr_(obj: Any, name: str) -> bool:
            try:
                self.getattr(obj, name)
                return True
            except PyError as e:
                if e.etype == "AttributeError":
                    return False
                raise

        def range_(*a: int) -> range:
            r = range(*a)
            if len(r) > MAX_LEN:
                raise NotModelled("a range this long")
            return r

        def type_(v: Any) -> Any:
            if isinstance(v, ExcValue):
                return ExcClass(v.etype)
            if isinstance(v, Obj):
                return PyType("module" if v.kind == "module" else v.cls or v.name)
            if isinstance(v, Func):
                return PyType("builtin_function_or_method")
            return PyType(type(v).__name__)

        def exit_(code: Any = None) -> None:
            raise _Exit(code)

        def import_(name: str, *a: Any, **kw: Any) -> Obj:
            self.import_module(name)
            return self.import_module(name.split(".")[0])

        b: dict[str, Any] = {
            "print": Func("print", self._print), "getattr": Func("getattr", getattr_),
            "hasattr": Func("hasattr", hasattr_), "range": Func("range", range_), "type": Func("type", type_),
            "exit": Func("exit", exit_), "quit": Func("quit", exit_), "__import__": Func("__import__", import_),
            "True": True, "False": False, "None": None,
        }
        for name in ("len", "str", "int", "float", "bool", "repr", "sorted", "set", "frozenset", "list", "tuple",
                     "dict", "min", "max", "sum", "any", "all", "enumerate", "zip", "abs", "round", "chr", "ord",
                     "reversed", "hex", "bin", "oct", "divmod", "format", "map", "filter", "isinstance"):
            b[name] = Func(name, self._safe_builtin(name))
        for name in _BASES:
            if "." not in name:
                b[name] = ExcClass(name)
        return b

    def _safe_builtin(self, name: str) -> Callable[..., Any]:
        real = getattr(_builtins, name)

        def call(*args: Any, **kw: Any) -> Any:
            if name == "isinstance":
                return self._isinstance(*args)
            if name == "format" and len(args) > 1:
                _check_spec(str(args[1]))
            if name in ("str", "repr") and args and not isinstance(args[0], _PLAIN):
                return str(args[0]) if name == "str" else repr(args[0])
            return self._wrap_result(real(*args, **kw))

        return call

    def _isinstance(self, v: Any, t: Any) -> bool:
        types = t if isinstance(t, tuple) else (t,)
        for x in types:
            if isinstance(x, ExcClass):
                if isinstance(v, ExcValue) and _is_a(v.etype, x.name):
                    return True
            elif isinstance(x, Func) and x.name in ("str", "int", "float", "bool", "list", "tuple", "dict", "set",
                                                   "frozenset", "bytes"):
                if isinstance(v, getattr(_builtins, x.name)):
                    return True
            else:
                raise PyError("TypeError", "isinstance() arg 2 must be a type, a tuple of types, or a union")
        return False

    def _wrap_result(self, v: Any) -> Any:
        if isinstance(v, (str, bytes, list, tuple)):
            self.alloc += len(v)
            if len(v) > MAX_LEN or self.alloc > MAX_ALLOC:
                raise NotModelled("a value this large")
        if isinstance(v, (map, filter, zip, enumerate, type(reversed([])))):
            out = []
            for x in v:
                out.append(x)
                if len(out) > MAX_LEN:
                    raise NotModelled("a sequence this long")
            return out
        return v

    # -- names --
    def lookup(self, name: str) -> Any:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        if name in self.builtins:
            return self.builtins[name]
        if hasattr(_builtins, name):  # a real builtin (open, eval, dir ...) the simulator does not run
            raise NotModelled(f"the builtin '{name}'")
        msg = f"name '{name}' is not defined"
        cands = [k for s in reversed(self.scopes) for k in s] + sorted(dir(_builtins))
        hint = suggestion(name, cands)
        if hint is not None:
            msg += f". Did you mean: '{hint}'?"
        elif name in _sys.stdlib_module_names:
            msg += f". Did you forget to import '{name}'?"
        raise PyError("NameError", msg)

    def bind(self, target: ast.AST, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.scopes[-1][target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            try:
                items = list(value) if isinstance(value, _PLAIN) else None
            except TypeError as exc:
                raise PyError("TypeError", str(exc)) from None
            if items is None:
                raise PyError("TypeError", f"cannot unpack non-iterable {_tname(value)} object")
            if len(items) != len(target.elts):
                if len(items) > len(target.elts):
                    raise PyError("ValueError", f"too many values to unpack (expected {len(target.elts)})")
                raise PyError("ValueError",
                              f"not enough values to unpack (expected {len(target.elts)}, got {len(items)})")
            for t, v in zip(target.elts, items, strict=True):
                self.bind(t, v)
        elif isinstance(target, ast.Subscript):
            obj = self.eval(target.value)
            key = self.eval(target.slice)
            if not isinstance(obj, (list, dict)):
                raise PyError("TypeError", f"'{_tname(obj)}' object does not support item assignment")
            self._py(lambda: obj.__setitem__(key, value))
        else:
            raise NotModelled(f"assigning to {type(target).__name__}")

    # -- imports --
    def import_module(self, name: str) -> Obj:
        if name in self.modules:
            return self.modules[name]
        top = name.split(".")[0]
        ctx = self.ctx
        if top in ("importlib", "shutil", "sys", "os", "json", "platform") or top in ctx.packages:
            mod = self._module(name)
            if mod is None and top not in ctx.packages:  # a part of the standard library not modelled
                raise NotModelled(f"the standard module '{name}'")
            if mod is None:
                err = PyError("ModuleNotFoundError", f"No module named '{name}'")
                err.name = name
                raise err
            self.modules[name] = mod
            return mod
        if top in _sys.stdlib_module_names:
            raise NotModelled(f"the standard module '{top}'")
        err = PyError("ModuleNotFoundError", f"No module named '{top}'")
        err.name = top
        raise err

    def _module(self, name: str) -> Obj | None:
        ctx = self.ctx
        top = name.split(".")[0]
        if top in ctx.packages and top not in ctx.modelled:  # a real package the simulator does not model
            return Obj(name, opaque=True)
        if self._table is None:
            self._table = self._modules()
        return self._table.get(name)

    def _modules(self) -> dict[str, Obj]:
        ctx = self.ctx
        m: dict[str, Obj] = {}

        def import_module(name: str, package: Any = None) -> Obj:
            if not isinstance(name, str):
                raise PyError("AttributeError", f"'{_tname(name)}' object has no attribute 'startswith'")
            if name.startswith("."):
                raise NotModelled("relative imports")
            parts = name.split(".")
            for k in range(1, len(parts) + 1):
                self.import_module(".".join(parts[:k]))
            return self.import_module(name)

        def which(cmd: Any, mode: Any = None, path: Any = None) -> str | None:
            if path is not None:
                raise NotModelled("shutil.which(path=...)")
            if "/" in str(cmd):
                return cmd if cmd in ctx.commands.values() else None
            return ctx.commands.get(cmd)

        def version(dist: Any) -> str:
            v = ctx.packages.get(str(dist).replace("-", "_").lower())
            if not v:
                raise PyError("importlib.metadata.PackageNotFoundError", f"No package metadata was found for {dist}",
                              (dist,))
            return v

        metadata = Obj("importlib.metadata", {"version": Func("version", version, "function"),
                                              "PackageNotFoundError":
                                                  ExcClass("importlib.metadata.PackageNotFoundError")})
        m["importlib"] = Obj("importlib", {"import_module": Func("import_module", import_module, "function"),
                                           "metadata": metadata})
        m["importlib.metadata"] = metadata
        m["shutil"] = Obj("shutil", {"which": Func("which", which, "function")})
        m["sys"] = Obj("sys", {
            "version": f"{PY_VERSION} (main, Feb  4 2026, 14:48:35) [GCC 13.3.0]",
            "version_info": (3, 12, 3, "final", 0), "platform": "linux", "argv": list(ctx.argv),
            "executable": "/usr/bin/python3", "exit": Func("exit", self.builtins["exit"].fn),
            "stdout": self.stdout, "stderr": self.stderr, "maxsize": 2**63 - 1})
        environ = dict(ctx.env)
        m["os"] = Obj("os", {
            "environ": environ, "sep": "/", "name": "posix", "linesep": "\n",
            "getenv": Func("getenv", lambda k, d=None: environ.get(k, d), "function"),
            "getcwd": Func("getcwd", lambda: "/", "function"),
            "cpu_count": Func("cpu_count", lambda: 20, "function")})
        m["os.path"] = Obj("posixpath", {f: Func(f, getattr(posixpath, f), "function")
                                         for f in ("join", "basename", "dirname", "splitext", "normpath", "isabs")})
        m["os"].attrs["path"] = m["os.path"]
        m["json"] = Obj("json", {"dumps": Func("dumps", _json_dumps, "function"),
                                 "loads": Func("loads", _json_loads, "function")})
        m["platform"] = Obj("platform", {
            "machine": Func("machine", lambda: "aarch64", "function"),
            "system": Func("system", lambda: "Linux", "function"),
            "python_version": Func("python_version", lambda: PY_VERSION, "function")})
        pk = ctx.packages
        if "torch" in pk:
            m["torch"] = self._torch()
            m["torch.cuda"] = m["torch"].attrs["cuda"]
            m["torch.version"] = m["torch"].attrs["version"]
        if "vllm" in pk:
            reg = _registry("vllm.model_executor.models.registry._ModelRegistry", ctx.vllm_archs)
            models = Obj("vllm.model_executor.models", {"ModelRegistry": reg})
            executor = Obj("vllm.model_executor", {"models": models})
            m["vllm"] = Obj("vllm", {"__version__": pk["vllm"], "model_executor": executor,
                                     "__file__": f"{SITE}/vllm/__init__.py"})
            m["vllm.model_executor"] = executor
            m["vllm.model_executor.models"] = models
        if "sglang" in pk:
            reg = _registry("sglang.srt.models.registry._ModelRegistry", ctx.sglang_archs)
            registry = Obj("sglang.srt.models.registry", {"ModelRegistry": reg})
            models = Obj("sglang.srt.models", {"registry": registry})
            srt = Obj("sglang.srt", {"models": models})
            m["sglang"] = Obj("sglang", {"__version__": pk["sglang"], "srt": srt})
            m["sglang.srt"], m["sglang.srt.models"], m["sglang.srt.models.registry"] = srt, models, registry
        for name in ("transformers", "ray"):
            if name in pk:
                m[name] = Obj(name, {"__version__": pk[name], "__file__": f"{SITE}/{name}/__init__.py"})
        return m

    def _torch(self) -> Obj:
        ctx = self.ctx

        def need_gpu() -> None:
            if ctx.gpu is None:
                raise PyError("RuntimeError", NO_DRIVER)

        def device_ok(device: Any) -> None:
            need_gpu()
            if device not in (None, 0, "cuda", "cuda:0"):
                raise PyError("AssertionError", "Invalid device id")

        def capability(device: Any = None) -> tuple[int, int]:
            device_ok(device)
            assert ctx.gpu is not None
            return ctx.gpu

        def name(device: Any = None) -> str:
            device_ok(device)
            return ctx.gpu_name

        def current() -> int:
            need_gpu()
            return 0

        cuda = Obj("torch.cuda", {
            "is_available": Func("is_available", lambda: ctx.gpu is not None, "function"),
            "device_count": Func("device_count", lambda: 1 if ctx.gpu is not None else 0, "function"),
            "get_device_capability": Func("get_device_capability", capability, "function"),
            "get_device_name": Func("get_device_name", name, "function"),
            "current_device": Func("current_device", current, "function"),
            # torch returns [] when CUDA is not available (torch/cuda/__init__.py get_arch_list)
            "get_arch_list": Func("get_arch_list", lambda: list(ctx.cuda_archs) if ctx.gpu is not None else [],
                                  "function"),
        })
        version = Obj("torch.version", {"cuda": ctx.cuda, "__version__": ctx.packages["torch"], "hip": None})
        return Obj("torch", {"__version__": ctx.packages["torch"], "cuda": cuda, "version": version,
                             "__file__": f"{SITE}/torch/__init__.py"})

    # -- attributes --
    def getattr(self, obj: Any, name: str) -> Any:
        if isinstance(obj, Obj):
            if obj.opaque:
                raise NotModelled(f"{obj.name}.{name}")
            if name in obj.attrs:
                return obj.attrs[name]
            if name == "__name__":
                return obj.name
            if obj.kind == "module":
                sub = f"{obj.name}.{name}"
                if sub in self.modules:
                    return self.modules[sub]
                msg = f"module '{obj.name}' has no attribute '{name}'"
            else:
                msg = f"'{obj.cls or obj.name}' object has no attribute '{name}'"
            hint = suggestion(name, sorted(obj.attrs))
            raise PyError("AttributeError", msg + (f". Did you mean: '{hint}'?" if hint else ""))
        if isinstance(obj, ExcValue):
            if name == "args":
                return obj.args
            if name == "name" and _is_a(obj.etype, "ImportError"):
                return getattr(obj, "import_name", None)
            raise PyError("AttributeError", f"'{obj.etype}' object has no attribute '{name}'")
        if isinstance(obj, (ExcClass, PyType)) and name in ("__name__", "__qualname__"):
            return obj.name
        if isinstance(obj, Func) and name == "__name__":
            return obj.name
        for t, names in _METHODS.items():
            if type(obj) is t and name in names:
                real = getattr(obj, name)
                return Func(f"{t.__name__}.{name}", self._method(real, name), "builtin")
        if isinstance(obj, (*_PLAIN, ExcClass, PyType, Func)):
            if name.startswith("__") or hasattr(obj, name):
                raise NotModelled(f"'{_tname(obj)}.{name}'")
            raise PyError("AttributeError", f"'{_tname(obj)}' object has no attribute '{name}'")
        raise NotModelled(f"attribute '{name}' of {_tname(obj)}")

    def _method(self, real: Callable[..., Any], name: str) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            if name in _WIDTH_METHODS and args and isinstance(args[0], int) and args[0] > MAX_LEN:
                raise NotModelled("a string this wide")
            return self._wrap_result(real(*args, **kw))

        return call

    # -- running --
    def _py(self, fn: Callable[[], Any]) -> Any:
        """Run a plain-value operation, turning Python's own exception into the program's."""
        try:
            return fn()
        except (PyError, NotModelled, _Exit, _Break, _Continue):
            raise
        except RecursionError:
            raise NotModelled("a value nested this deep") from None
        except Exception as exc:  # a TypeError / ValueError / KeyError / ZeroDivisionError of the operation
            name = type(exc).__name__
            err = PyError(name, str(exc) if not isinstance(exc, KeyError) else repr(exc.args[0]) if exc.args else "",
                          exc.args)
            raise err from None

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise NotModelled("a program that runs this long")

    def run_body(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.exec(stmt)

    def exec(self, node: ast.stmt) -> None:
        self.tick()
        try:
            self._exec(node)
        except PyError as e:
            if e.lineno is None:
                e.lineno = node.lineno
            raise

    def _exec(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Expr):
            self.eval(node.value)
        elif isinstance(node, ast.Assign):
            value = self.eval(node.value)
            for t in node.targets:
                self.bind(t, value)
        elif isinstance(node, ast.AugAssign):
            if not isinstance(node.target, ast.Name):
                raise NotModelled("augmented assignment to anything but a name")
            cur = self.lookup(node.target.id)
            self.scopes[-1][node.target.id] = self.binop(node.op, cur, self.eval(node.value))
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.bind(node.target, self.eval(node.value))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                mod = self.import_dotted(alias.name)
                if alias.asname:
                    self.scopes[-1][alias.asname] = self.import_module(alias.name)
                else:
                    self.scopes[-1][alias.name.split(".")[0]] = mod
        elif isinstance(node, ast.ImportFrom):
            self._import_from(node)
        elif isinstance(node, ast.If):
            self.run_body(node.body if self.truth(self.eval(node.test)) else node.orelse)
        elif isinstance(node, ast.For):
            self._for(node)
        elif isinstance(node, ast.While):
            while self.truth(self.eval(node.test)):
                self.tick()
                try:
                    self.run_body(node.body)
                except _Break:
                    break
                except _Continue:
                    continue
            else:
                self.run_body(node.orelse)
        elif isinstance(node, ast.Break):
            raise _Break
        elif isinstance(node, ast.Continue):
            raise _Continue
        elif isinstance(node, ast.Pass):
            pass
        elif isinstance(node, ast.Try):
            self._try(node)
        elif isinstance(node, ast.Raise):
            self._raise(node)
        elif isinstance(node, ast.Assert):
            if not self.truth(self.eval(node.test)):
                msg = "" if node.msg is None else self._str(self.eval(node.msg))
                raise PyError("AssertionError", msg)
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                if not isinstance(t, ast.Name) or t.id not in self.scopes[-1]:
                    raise NotModelled("del of anything but a defined name")
                del self.scopes[-1][t.id]
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            pass
        else:
            raise NotModelled(f"the '{_stmt_word(node)}' statement")

    def import_dotted(self, name: str) -> Obj:
        parts = name.split(".")
        for k in range(1, len(parts) + 1):
            self.import_module(".".join(parts[:k]))
        return self.import_module(parts[0])

    def _import_from(self, node: ast.ImportFrom) -> None:
        if node.level:
            raise NotModelled("relative imports")
        modname = node.module or ""
        mod = self.import_dotted(modname)
        mod = self.import_module(modname)
        for alias in node.names:
            if alias.name == "*":
                raise NotModelled("from ... import *")
            if mod.opaque:
                val: Any = Obj(f"{modname}.{alias.name}", opaque=True)
            elif alias.name in mod.attrs:
                val = mod.attrs[alias.name]
            else:
                try:
                    val = self.import_module(f"{modname}.{alias.name}")
                except PyError:
                    where = f"{SITE}/{modname.replace('.', '/')}/__init__.py" if modname.split(".")[0] in \
                        self.ctx.packages else "unknown location"
                    err = PyError("ImportError", f"cannot import name '{alias.name}' from '{modname}' ({where})")
                    err.name = modname
                    raise err from None
            self.scopes[-1][alias.asname or alias.name] = val

    def _for(self, node: ast.For) -> None:
        it = self.eval(node.iter)
        items = self.iterate(it)
        broke = False
        for v in items:
            self.tick()
            self.bind(node.target, v)
            try:
                self.run_body(node.body)
            except _Break:
                broke = True
                break
            except _Continue:
                continue
        if not broke:
            self.run_body(node.orelse)

    def iterate(self, v: Any) -> list[Any]:
        if isinstance(v, _PLAIN):
            try:
                items = list(v)
            except TypeError as exc:
                raise PyError("TypeError", str(exc)) from None
            return items
        raise PyError("TypeError", f"'{_tname(v)}' object is not iterable")

    def _try(self, node: ast.Try) -> None:
        try:
            try:
                self.run_body(node.body)
            except PyError as e:
                for h in node.handlers:
                    if self._matches(h, e):
                        if h.name:
                            val = ExcValue(e.etype, e.msg, e.pyargs)
                            if e.name is not None:
                                val.import_name = e.name  # type: ignore[attr-defined]
                            self.scopes[-1][h.name] = val
                        self.run_body(h.body)
                        break
                else:
                    raise
            else:
                self.run_body(node.orelse)
        finally:
            self.run_body(node.finalbody)

    def _matches(self, h: ast.ExceptHandler, e: PyError) -> bool:
        if h.type is None:
            return True
        t = self.eval(h.type)
        types = t if isinstance(t, tuple) else (t,)
        for x in types:
            if not isinstance(x, ExcClass):
                raise PyError("TypeError", "catching classes that do not inherit from BaseException is not allowed")
            if _is_a(e.etype, x.name):
                return True
        return False

    def _raise(self, node: ast.Raise) -> None:
        if node.exc is None:
            raise NotModelled("a bare raise")
        v = self.eval(node.exc)
        if isinstance(v, ExcClass):
            raise PyError(v.name)
        if isinstance(v, ExcValue):
            raise PyError(v.etype, v.msg, v.args)
        raise PyError("TypeError", "exceptions must derive from BaseException")

    # -- expressions --
    def truth(self, v: Any) -> bool:
        if isinstance(v, (Obj, Func, ExcClass, ExcValue, PyType)):
            return True
        return bool(v)

    def eval(self, node: ast.expr) -> Any:
        self.tick()
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            return self.getattr(self.eval(node.value), node.attr)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.BinOp):
            return self.binop(node.op, self.eval(node.left), self.eval(node.right))
        if isinstance(node, ast.UnaryOp):
            v = self.eval(node.operand)
            if isinstance(node.op, ast.Not):
                return not self.truth(v)
            ops = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
            return self._py(lambda: ops[type(node.op)](_plain(v)))
        if isinstance(node, ast.BoolOp):
            v = None
            for sub in node.values:
                v = self.eval(sub)
                if isinstance(node.op, ast.And) and not self.truth(v):
                    return v
                if isinstance(node.op, ast.Or) and self.truth(v):
                    return v
            return v
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.IfExp):
            return self.eval(node.body) if self.truth(self.eval(node.test)) else self.eval(node.orelse)
        if isinstance(node, ast.Tuple):
            return tuple(self._elts(node.elts))
        if isinstance(node, ast.List):
            return self._elts(node.elts)
        if isinstance(node, ast.Set):
            return self._py(lambda: set(self._elts(node.elts)))
        if isinstance(node, ast.Dict):
            out: dict[Any, Any] = {}
            for k, v in zip(node.keys, node.values, strict=True):
                if k is None:
                    out.update(_plain_dict(self.eval(v)))
                else:
                    key = self.eval(k)
                    val = self.eval(v)
                    self._py(lambda key=key, val=val: out.__setitem__(key, val))
            return out
        if isinstance(node, ast.JoinedStr):
            return "".join(self._fstring_part(v) for v in node.values)
        if isinstance(node, ast.FormattedValue):
            return self._fstring_part(node)
        if isinstance(node, ast.Subscript):
            obj = self.eval(node.value)
            key = self.eval(node.slice)
            if not isinstance(obj, _PLAIN):
                raise PyError("TypeError", f"'{_tname(obj)}' object is not subscriptable")
            return self._py(lambda: obj[key])
        if isinstance(node, ast.Slice):
            lo = None if node.lower is None else self.eval(node.lower)
            hi = None if node.upper is None else self.eval(node.upper)
            st = None if node.step is None else self.eval(node.step)
            return slice(lo, hi, st)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            return self._comprehension(node)
        if isinstance(node, ast.Starred):
            raise NotModelled("starred expressions outside calls")
        raise NotModelled(f"{_expr_word(node)}")

    def _elts(self, elts: list[ast.expr]) -> list[Any]:
        out: list[Any] = []
        for e in elts:
            if isinstance(e, ast.Starred):
                out.extend(self.iterate(self.eval(e.value)))
            else:
                out.append(self.eval(e))
        return out

    def _fstring_part(self, v: ast.expr) -> str:
        if isinstance(v, ast.Constant):
            return str(v.value)
        assert isinstance(v, ast.FormattedValue)
        val = self.eval(v.value)
        if v.conversion == ord("r"):
            val = repr(val)
        elif v.conversion == ord("s"):
            val = self._str(val)
        elif v.conversion == ord("a"):
            val = ascii(val)
        spec = "" if v.format_spec is None else self.eval(v.format_spec)
        _check_spec(spec)
        if not isinstance(val, _PLAIN):
            if spec:
                raise PyError("TypeError", f"unsupported format string passed to {_tname(val)}.__format__")
            return self._str(val)
        return self._py(lambda: format(val, spec))

    def _call(self, node: ast.Call) -> Any:
        fn = self.eval(node.func)
        args: list[Any] = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                args.extend(self.iterate(self.eval(a.value)))
            else:
                args.append(self.eval(a))
        kw: dict[str, Any] = {}
        for k in node.keywords:
            if k.arg is None:
                kw.update(_plain_dict(self.eval(k.value)))
            else:
                kw[k.arg] = self.eval(k.value)
        if isinstance(fn, Func):
            return self._py(lambda: fn(*args, **kw))
        if isinstance(fn, ExcClass):
            if kw:
                raise PyError("TypeError", f"{fn.name}() takes no keyword arguments")
            msg = "" if not args else (str(args[0]) if len(args) == 1 else str(tuple(args)))
            return ExcValue(fn.name, msg, tuple(args))
        if isinstance(fn, Obj) and fn.opaque:
            raise NotModelled(f"{fn.name}()")
        raise PyError("TypeError", f"'{_tname(fn)}' object is not callable")

    def binop(self, op: ast.operator, a: Any, b: Any) -> Any:
        ops: dict[type, Callable[[Any, Any], Any]] = {
            ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
            ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
            ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
            ast.LShift: operator.lshift, ast.RShift: operator.rshift}
        f = ops.get(type(op))
        if f is None:
            raise NotModelled("the @ operator")
        if isinstance(op, ast.Mod) and isinstance(a, str):
            b = tuple(_plain_fmt(x) for x in b) if isinstance(b, tuple) else _plain_fmt(b)
            _check_spec(a)  # a width this large, written or from a ``*``
            if any(isinstance(x, int) and abs(x) > MAX_LEN for x in (b if isinstance(b, tuple) else (b,))) \
                    and "*" in a:
                raise NotModelled("a format width this large")
        else:
            a, b = _plain(a), _plain(b)
        if isinstance(op, ast.Mult):
            for x, y in ((a, b), (b, a)):
                if isinstance(x, (str, bytes, list, tuple)) and isinstance(y, int) and len(x) * y > MAX_LEN:
                    raise NotModelled("a value this large")
        if isinstance(op, (ast.Pow, ast.LShift)) and isinstance(b, int) and b > 4096 and \
                isinstance(a, int) and abs(a) > 1:
            raise NotModelled("a number this large")
        return self._wrap_result(self._py(lambda: f(a, b)))

    def _compare(self, node: ast.Compare) -> bool:
        left = self.eval(node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = self.eval(right_node)
            if isinstance(op, (ast.Is, ast.IsNot)):
                ok = (left is right) or (left is None and right is None)
                ok = ok if isinstance(op, ast.Is) else not ok
            elif isinstance(op, (ast.In, ast.NotIn)):
                if not isinstance(right, _PLAIN):
                    raise PyError("TypeError", f"argument of type '{_tname(right)}' is not iterable")
                ok = self._py(lambda left=left, right=right: left in right)
                ok = ok if isinstance(op, ast.In) else not ok
            else:
                f = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
                     ast.Gt: operator.gt, ast.GtE: operator.ge}[type(op)]
                ok = self._py(lambda f=f, left=left, right=right: f(left, right))
            if not ok:
                return False
            left = right
        return True

    def _comprehension(self, node: ast.expr) -> Any:
        gens = node.generators  # type: ignore[attr-defined]
        out: list[Any] = []
        scope: dict[str, Any] = {}
        self.scopes.append(scope)
        try:
            def rec(k: int) -> None:
                if k == len(gens):
                    if isinstance(node, ast.DictComp):
                        out.append((self.eval(node.key), self.eval(node.value)))
                    else:
                        out.append(self.eval(node.elt))  # type: ignore[attr-defined]
                    if len(out) > MAX_LEN:
                        raise NotModelled("a sequence this long")
                    return
                g = gens[k]
                if g.is_async:
                    raise NotModelled("async comprehensions")
                for v in self.iterate(self.eval(g.iter)):
                    self.tick()
                    self.bind(g.target, v)
                    if all(self.truth(self.eval(c)) for c in g.ifs):
                        rec(k + 1)

            rec(0)
        finally:
            self.scopes.pop()
        if isinstance(node, ast.SetComp):
            return self._py(lambda: set(out))
        if isinstance(node, ast.DictComp):
            return self._py(lambda: dict(out))
        return out


def _registry(cls: str, archs: tuple[str, ...]) -> Obj:
    # vLLM's ``get_supported_archs`` returns ``self.models.keys()``: a dict_keys view
    return Obj(cls.rsplit(".", 1)[-1], {"get_supported_archs": Func("get_supported_archs",
                                                                   lambda: dict.fromkeys(archs).keys(), "method"),
                                        "is_text_generation_model": Func("is_text_generation_model",
                                                                         lambda *a, **k: True, "method")},
               kind="object", cls=cls.rsplit(".", 1)[-1])


def _tname(v: Any) -> str:
    if isinstance(v, Obj):
        return "module" if v.kind == "module" else (v.cls or v.name)
    if isinstance(v, Func):
        return "builtin_function_or_method" if v.kind == "builtin" else "function"
    if isinstance(v, ExcValue):
        return v.etype
    if isinstance(v, (ExcClass, PyType)):
        return "type"
    return type(v).__name__


def _plain(v: Any) -> Any:
    if isinstance(v, _PLAIN):
        return v
    raise PyError("TypeError", f"unsupported operand type for {_tname(v)}")


def _plain_fmt(v: Any) -> Any:
    """A ``%`` argument: plain values as they are, the image's objects as their text."""
    return v if isinstance(v, _PLAIN) else str(v)


def _plain_dict(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise PyError("TypeError", f"argument after ** must be a mapping, not {_tname(v)}")
    return v


def _check_spec(spec: str) -> None:
    digits = "".join(ch if ch.isdigit() else " " for ch in spec).split()
    if any(len(d) > 6 for d in digits):
        raise NotModelled("a format width this large")


def _json_dumps(obj: Any, indent: Any = None, sort_keys: bool = False, **kw: Any) -> str:
    try:
        return _json.dumps(obj, indent=indent, sort_keys=sort_keys)
    except TypeError as exc:
        raise PyError("TypeError", str(exc)) from None


def _json_loads(s: Any) -> Any:
    try:
        return _json.loads(s)
    except _json.JSONDecodeError as exc:
        raise PyError("json.decoder.JSONDecodeError", str(exc)) from None


def _stmt_word(node: ast.stmt) -> str:
    return {"FunctionDef": "def", "AsyncFunctionDef": "async def", "ClassDef": "class", "With": "with",
            "AsyncWith": "async with", "AsyncFor": "async for", "Return": "return", "Match": "match",
            "TryStar": "try/except*"}.get(type(node).__name__, type(node).__name__)


def _expr_word(node: ast.expr) -> str:
    return {"Lambda": "lambda", "NamedExpr": "the := operator", "Await": "await", "Yield": "yield",
            "YieldFrom": "yield from"}.get(type(node).__name__, type(node).__name__)


# ---- one run -----------------------------------------------------------------------------------


def syntax_error(program: str) -> str | None:
    """CPython's report of a program that does not compile (``File "<string>", line N`` …), or None."""
    try:
        compile(program, "<string>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return "".join(traceback.format_exception_only(type(exc), exc))
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
        return f"{type(exc).__name__}: {exc}\n"
    return None


def run_program(program: str, ctx: PyContext) -> tuple[str, str, int]:
    """Run ``python3 -c program`` in ``ctx``: (stdout, stderr, exit status)."""
    bad = syntax_error(program)
    if bad is not None:
        return "", bad, 1
    tree = ast.parse(program, "<string>")
    m = Machine(ctx)
    rc = 0
    try:
        m.run_body(tree.body)
    except PyError as e:
        m.err.append("Traceback (most recent call last):\n"
                     f'  File "<string>", line {e.lineno or 1}, in <module>\n'
                     f"{e.etype}{': ' + e.msg if e.msg else ''}\n")
        rc = 1
    except _Exit as e:
        if e.code is None:
            rc = 0
        elif isinstance(e.code, bool) or not isinstance(e.code, int):
            m.err.append(f"{e.code}\n")
            rc = 1
        else:
            rc = e.code & 0xFF
    except (_Break, _Continue):  # compile() refuses these outside a loop; kept for safety
        rc = 1
    except NotModelled as e:
        m.err.append(f"sparksim: python3 -c: {e} is not modelled by the simulator\n")
        rc = 1
    return "".join(m.out), "".join(m.err), rc
