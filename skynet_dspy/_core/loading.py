"""Turning a metric source (a path to metric.py, a module, or a callable) into a `score` to call, wherever the
metric runs. Each metric file runs as a fresh module of its own, with private copies of the modules beside it."""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import inspect
import itertools
import linecache
import sys
import threading
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import MetricLoadError
from .types import Item, MetricInfo
from .values import a_type, identifier

_module_numbers = itertools.count(1)
_SCORE_EXAMPLE = "def score(input, output, expected=None):"
# Names whose use in a metric's code means it reads the program's measured run.
_MEASURING_NAMES = frozenset({"reward", "observation", "service_cost"})


@dataclass(frozen=True)
class LoadedMetric:
    """A `score` function and what was found beside it."""

    score: Callable[..., Any]
    takes_expected: bool
    name: str
    reward_spec: dict[str, Any] | None = None
    module: ModuleType | None = None
    label: str = ""
    file: str | None = None

    def info(self) -> MetricInfo:
        """The plain facts of this metric, as sent back from a worker process."""
        return MetricInfo(
            name=self.name,
            label=self.label or self.name,
            takes_expected=self.takes_expected,
            reward_spec=self.reward_spec if isinstance(self.reward_spec, dict) else None,
            uses_measurement=uses_measurement(self),
            file=self.file,
            hint=signature_hint(self.score),
            is_async=inspect.iscoroutinefunction(self.score) or inspect.iscoroutinefunction(type(self.score).__call__),
        )


def register_skynet() -> None:
    """Make `import skynet` give the package's helper module (skynet_dspy/__init__.py imports it first)."""
    sys.modules["skynet"] = sys.modules["skynet_dspy.skynet"]


def load(source: Any, file: str | None = None) -> LoadedMetric:
    """Load `source`: a path (str or Path) to a metric file, an imported module, or a `score` callable.
    `file`: where the path leads, resolved (a worker's view), read in its place; messages keep `source`."""
    if isinstance(source, (str, Path)):
        if file is not None and not Path(file).exists():
            raise FileNotFoundError(f"metric file not found: {source}")
        module = load_file(Path(file or source))
        return _from_module(module, str(source), Path(source).stem)
    if isinstance(source, ModuleType):
        label = getattr(source, "__file__", None) or source.__name__
        return _from_module(source, label, source.__name__.rpartition(".")[2])
    if callable(source):
        label = getattr(source, "__qualname__", None) or type(source).__name__
        name = getattr(source, "__name__", None) or type(source).__name__
        owner = inspect.getmodule(source)
        spec = getattr(owner, "REWARD_SPEC", None)
        file = next((code.co_filename for code in _code_objects(source)), None)
        return LoadedMetric(source, _takes_expected(source, label), identifier(name), spec, owner, label, file)
    raise TypeError(
        "load_metric() takes a path to metric.py, an imported module, or a score function; "
        f"got {type(source).__name__}"
    )


def _from_module(module: ModuleType, name: str, stem: str) -> LoadedMetric:
    score = getattr(module, "score", None)
    if score is None:
        functions = sorted(
            key for key, value in vars(module).items()
            if inspect.isfunction(value) and getattr(value, "__module__", None) == module.__name__
        )
        found = f" (it defines {', '.join(functions)})" if functions else ""
        raise MetricLoadError(
            f"{name} defines no function named `score`{found}. "
            f"Add `{_SCORE_EXAMPLE}` returning (score, {{'feedback': '...'}})."
        )
    if not callable(score):
        raise MetricLoadError(f"{name}: `score` is {a_type(score)}, not a function. Define `{_SCORE_EXAMPLE} ...`.")
    spec = getattr(module, "REWARD_SPEC", None)
    file = getattr(module, "__file__", None)
    return LoadedMetric(score, _takes_expected(score, name), identifier(stem), spec, module, name, file)


def load_file(path: Path) -> ModuleType:
    """Run a metric file as a fresh module of its own, so two files (or a changed file) never mix.

    Compiled here, not by the import system, whose bytecode cache keys on the mtime in whole seconds (a file
    edited twice within a second would run stale) and writes __pycache__ beside the user's file.
    """
    if path.is_dir():
        raise MetricLoadError(f"{path} is a folder; give the path of the metric file inside it, e.g. {path}/metric.py")
    if not path.is_file():
        raise FileNotFoundError(f"metric file not found: {path}")
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise MetricLoadError(f"{path} cannot be read: {exc.strerror or exc}") from None
    try:
        code = compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f", line {exc.lineno}" if exc.lineno else ""
        shown = f": `{exc.text.strip()}`" if exc.text and exc.text.strip() else ""
        message = f"{path}{where}: syntax error: {exc.msg}{shown}. Fix the file and load it again."
        raise MetricLoadError(message) from None
    except ValueError as exc:  # e.g. null bytes in the source
        raise MetricLoadError(f"{path} is not Python source: {exc}") from None

    register_skynet()
    number = next(_module_numbers)
    module_name = f"skynet_metric_{number}_{identifier(path.stem)}"
    siblings = _Siblings(f"skynet_metric_{number}__beside", path.resolve().parent)
    module = ModuleType(module_name)
    module.__file__ = str(path)
    module.__package__ = siblings.root  # `from . import helper` finds modules beside the file too
    module.__dict__["__builtins__"] = siblings.builtins
    sys.modules[module_name] = module  # dataclasses, pickling and typing look the module up by name
    _remember_source(path, source)
    try:
        exec(code, module.__dict__)
    except BaseException as exc:  # SystemExit / KeyboardInterrupt at import are the file's fault too
        sys.modules.pop(module_name, None)
        siblings.discard()
        raise MetricLoadError(_import_message(path, exc)) from None
    return module


class _Siblings:
    """The modules beside one loaded metric file: `import helper` loads helper.py from its folder as
    `<root>.helper`, private to this load (sys.path untouched; never a standard-library name or `skynet`)."""

    _lock = threading.Lock()
    _roots: dict[str, _Siblings] = {}  # root package name -> its metric's siblings, read by _SiblingFinder

    def __init__(self, root: str, folder: Path):
        self.root = root
        self.folder = folder
        self._found: dict[str, bool] = {}
        self.builtins = dict(vars(builtins))
        self.builtins["__import__"] = self._import
        package = ModuleType(root)
        package.__path__ = [str(folder)]
        package.__package__ = root
        with self._lock:
            self._roots[root] = self
            if not any(finder is _SiblingFinder for finder in sys.meta_path):
                sys.meta_path.insert(0, _SiblingFinder)
        sys.modules[root] = package

    def _beside(self, name: str) -> bool:
        found = self._found.get(name)
        if found is None:
            found = name != "skynet" and name not in sys.stdlib_module_names and (
                (self.folder / f"{name}.py").is_file() or (self.folder / name / "__init__.py").is_file()
            )
            self._found[name] = found
        return found

    def _import(self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and name and self._beside(name.partition(".")[0]):
            module = builtins.__import__(f"{self.root}.{name}", globals, locals, fromlist, 0)
            return module if fromlist else sys.modules[f"{self.root}.{name.partition('.')[0]}"]
        return builtins.__import__(name, globals, locals, fromlist, level)

    def discard(self) -> None:
        """Forget this load's helper modules (after a failed load)."""
        with self._lock:
            self._roots.pop(self.root, None)
        for name in [name for name in sys.modules if name == self.root or name.startswith(self.root + ".")]:
            sys.modules.pop(name, None)


class _SiblingFinder:
    """Finds `<root>.helper` modules in the folder of the metric that owns `<root>`, and runs each from its source
    (never a cached .pyc) with that metric's import hook."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        root, _, rest = fullname.partition(".")
        siblings = _Siblings._roots.get(root)
        if siblings is None or not rest:
            return None
        base = siblings.folder.joinpath(*rest.split("."))
        for file, search in ((base / "__init__.py", [str(base)]), (base.parent / f"{base.name}.py", None)):
            if file.is_file():
                spec = importlib.util.spec_from_file_location(
                    fullname, file, loader=_SiblingFinder, submodule_search_locations=search)  # type: ignore[arg-type]
                if spec is not None:
                    spec.loader_state = siblings.builtins
                return spec
        return None

    @staticmethod
    def create_module(spec: importlib.machinery.ModuleSpec) -> None:
        return None

    @staticmethod
    def exec_module(module: ModuleType) -> None:
        path = Path(module.__spec__.origin)  # type: ignore[union-attr,arg-type]
        source = path.read_bytes()
        module.__dict__["__builtins__"] = module.__spec__.loader_state  # type: ignore[union-attr]
        _remember_source(path, source)
        exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)


def _remember_source(path: Path, source: bytes) -> None:
    """Make tracebacks and inspect show the version of the file that was run, even if it changes later."""
    try:
        lines = importlib.util.decode_source(source).splitlines(keepends=True)
    except (SyntaxError, UnicodeDecodeError):
        return
    linecache.cache[str(path)] = (len(source), None, lines, str(path))


def _import_message(path: Path, exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    line = _line_in(path, frames)
    where = f", line {line}" if line else ""
    code = linecache.getline(str(path), line).strip() if line else ""
    shown = f" (`{code}`)" if code else ""
    if isinstance(exc, SystemExit):
        what = f"called exit ({exc.code!r})"
    elif isinstance(exc, SyntaxError) and exc.filename and exc.filename != str(path):
        what = f"imported a file with a syntax error: {exc.filename}, line {exc.lineno}: {exc.msg}"
    else:
        message = str(exc)
        what = f"raised {type(exc).__name__}" + (f": {message}" if message else "")
        if line and _outside(path, frames[-1].filename):  # raised in, say, a helper module beside the file
            what += f" (in {frames[-1].filename}, line {frames[-1].lineno})"
    hint = "Fix the module-level code so the file imports cleanly."
    if isinstance(exc, ModuleNotFoundError):
        hint = (
            f"If it is a file beside {path.name}, check its name; if it is a package, install it into this "
            f"Python environment ({sys.executable})."
        )
    elif isinstance(exc, ImportError) and getattr(exc, "name", None) in ("skynet", "skynet_dspy.skynet"):
        hint = "The `skynet` module provides llm, reward, observation and service_cost."
    return f"{path}{where}{shown}: importing the file {what}. {hint}"


def _outside(path: Path, filename: str) -> bool:
    """True for a user's file other than the metric file (not <frozen ...>, importlib's or our import hook's)."""
    return filename not in (str(path), __file__) and not filename.startswith("<") and "importlib" not in filename


def _line_in(path: Path, frames: traceback.StackSummary) -> int | None:
    """The last line of `path` in a traceback's frames, if the file appears there."""
    resolved = path.resolve()
    lines = [f.lineno for f in frames
             if f.filename and (f.filename == str(path) or Path(f.filename).resolve() == resolved)]
    return lines[-1] if lines else None


def _takes_expected(score: Callable[..., Any], name: str) -> bool:
    """True for score(input, output, expected), False for score(input, output); else MetricLoadError."""
    try:
        signature = inspect.signature(score)
    except (TypeError, ValueError) as exc:  # some builtins and extension functions
        raise MetricLoadError(
            f"{name}: cannot read the parameters of score ({exc}). Define `{_SCORE_EXAMPLE}` in Python.",
            Item.SIGNATURE,
        ) from None
    params = signature.parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    problem = _keyword_problem(params)
    if problem is None and any(p.kind is p.VAR_POSITIONAL for p in params) and len(positional) <= 3:
        return True
    if problem is None and len(positional) in (2, 3):
        return len(positional) == 3
    if problem is None:
        count = f"{len(positional)} parameter{'' if len(positional) == 1 else 's'}"
        problem = f"takes {count}; score must take two, (input, output), or three, (input, output, expected)"
    raise MetricLoadError(f"{name}: score{signature} {problem}. Define `{_SCORE_EXAMPLE}`.", Item.SIGNATURE)


def _keyword_problem(params: Any) -> str | None:
    """What is wrong with score's keyword-only parameters: `expected` is passed by position, and nothing else is."""
    if any(p.name == "expected" and p.kind is p.KEYWORD_ONLY for p in params):
        return "takes `expected` as keyword-only, but it is passed by position"
    required = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    return f"needs keyword-only argument(s) {', '.join(required)}, which are never passed" if required else None


def _code_objects(fn: Any) -> list[types.CodeType]:
    """The code of a score function (functions, methods, partials, callable objects)."""
    candidates = (fn, getattr(fn, "func", None), type(fn).__dict__.get("__call__"))
    return [code for code in (getattr(c, "__code__", None) for c in candidates) if isinstance(code, types.CodeType)]


def _names_in(code: types.CodeType) -> set[str]:
    names = set(code.co_names) | set(code.co_freevars)  # free variables: a closure over `observation`
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_in(const)
    return names


def uses_measurement(loaded: LoadedMetric) -> bool:
    """Whether the code of score, its module or the modules beside it refers to reward, observation or
    service_cost (so its runs must be measured)."""
    modules = [loaded.module] if loaded.module is not None else []
    root = getattr(loaded.module, "__package__", None) or ""
    if root.startswith("skynet_metric_"):
        modules += [m for key, m in list(sys.modules.items()) if key.startswith(root + ".")]
    codes = _code_objects(loaded.score)
    codes += [value.__code__ for module in modules for value in list(vars(module).values())
              if isinstance(value, types.FunctionType)]
    names = set().union(*map(_names_in, codes), *map(vars, modules))  # a module-level name counts too
    return bool(names & _MEASURING_NAMES)


_DSPY_FIRST = frozenset({"example", "gold", "ex", "golden"})
_DSPY_SECOND = frozenset({"pred", "prediction", "predicted"})


def signature_hint(score: Callable[..., Any]) -> str | None:
    """Advice for a DSPy-style score(example, pred, trace=None), which is called with plain values here."""
    try:
        names = [p.name for p in inspect.signature(score).parameters.values()]
    except (TypeError, ValueError):
        return None
    dspy_style = (len(names) >= 2 and names[0] in _DSPY_FIRST and names[1] in _DSPY_SECOND) or (
        len(names) == 3 and names[2] == "trace"
    )
    if not dspy_style:
        return None
    return (
        f"score({', '.join(names)}) looks like a DSPy metric, but a Skynet metric is called as "
        "score(input, output, expected): `input` is a dict of the example's input fields, `output` what the "
        "program returned (the bare value for one output field), `expected` a dict of the labels. Define "
        f"`{_SCORE_EXAMPLE}` and read expected['label'] rather than example.label"
    )
