"""Callback types by name: the built-ins with their TOML arguments, and user classes.

Importing this module imports nothing heavy: built-in names map to import paths
and to a description of the arguments TOML may give them, so ``schedtrain check``
validates a built-in's arguments without torch. A class is imported only by
``resolve()`` (when a schedule runs, or ``schedtrain check --import``), and a user's
``"package.module:Class"`` must be a ``Callback`` subclass before it is called.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from schedtrain.errors import describe, did_you_mean
from schedtrain.imports import IMPORT_PATH_RE, import_class
from schedtrain.names import PLACEHOLDER_RE, is_name
from schedtrain.retention import SaverKind, policy_problems, saver_keep_problems
from schedtrain.spec import argtypes

__all__ = ["BUILTINS", "Param", "check_arguments", "is_import_path", "is_known", "resolve"]


@attrs.frozen
class Param:
    """One argument a built-in callback takes from TOML.

    Args:
        name: the argument (a key of the callback's table).
        expected: what a valid value is, as a message says it.
        check: whether a TOML value is valid.
        required: the table must give it.
    """

    name: str
    expected: str
    check: Callable[[Any], bool]
    required: bool = False


def _int(least: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and least <= v <= 2**63 - 1


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _flag(v: Any) -> bool:
    return isinstance(v, bool)


def _pairs(v: Any) -> bool:
    return (isinstance(v, list) and bool(v)
            and all(isinstance(p, list) and len(p) == 2 and all(_number(x) for x in p)
                    for p in v))


_MONITOR = Param("monitor", "a metric name such as 'val/loss'", _text)
_FOLDER = Param("folder", "a folder path", _text)
_MODE = Param("mode", "'min' or 'max'", lambda v: v in ("min", "max"))


#: Where a problem is, below the callback's table: argument names and list indexes.
Where = tuple[str | int, ...]


@attrs.frozen
class Builtin:
    """A built-in callback: where its class lives and what TOML may pass it."""

    target: str
    params: tuple[Param, ...] = ()
    #: Arguments only Python can pass (data, functions), named in the error.
    python_only: tuple[str, ...] = ()
    #: Checks spanning arguments or looking inside one, run once each argument is valid:
    #: ``(where, message)`` for each problem.
    check: Callable[[Mapping[str, Any]], list[tuple[Where, str]]] | None = None


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(_text(n) for n in v)


def _seconds(v: Any) -> bool:
    return _number(v) and v > 0


#: Inferencer type (an ``inferencers`` table's ``type``) -> its arguments.
INFERENCERS: Final[Mapping[str, tuple[Param, ...]]] = {
    "ScalarStats": (
        Param("names", "a non-empty list of names such as ['loss']",
              lambda v: _names(v) and bool(v)),
        Param("prefix", "a metric prefix such as 'val'", _text)),
    "ClassificationError": (
        Param("k", "a whole number >= 1", _int(1)),
        Param("name", "a metric name such as 'val-error-top1'", _text)),
    "TorchMetric": (
        Param("metric", "a class path such as 'torchmetrics.classification:MulticlassF1Score'",
              lambda v: isinstance(v, str) and is_import_path(v), required=True),
        Param("name", "a metric name such as 'val/f1'", _text, required=True),
        Param("args", "a table of the metric's arguments", lambda v: isinstance(v, dict))),
}


def _inferencer_problems(args: Mapping[str, Any]) -> list[tuple[Where, str]]:
    """Each ``inferencers`` entry is a table with a known ``type`` and valid arguments."""
    problems: list[tuple[Where, str]] = []
    for i, table in enumerate(args.get("inferencers", [])):
        if not isinstance(table, dict):
            problems.append((("inferencers", i), "expected a table such as { type = "
                             f"\"ClassificationError\", k = 5 }}, found {describe(table)}"))
            continue
        kind = table.get("type")
        if kind is None:
            problems.append((("inferencers", i, "type"), (
                f"missing key 'type': expected one of {', '.join(INFERENCERS)}")))
            continue
        if not isinstance(kind, str) or kind not in INFERENCERS:
            problems.append((("inferencers", i, "type"), (
                f"expected one of {', '.join(INFERENCERS)}, found {describe(kind)}"
                f"{did_you_mean(kind, INFERENCERS) if isinstance(kind, str) else ''}")))
            continue
        rest = {k: v for k, v in table.items() if k != "type"}
        for key, message in _param_problems(kind, INFERENCERS[kind], rest):
            problems.append((("inferencers", i, *((key,) if key else ())), message))
    return problems


def _threshold_problems(args: Mapping[str, Any]) -> list[tuple[Where, str]]:
    """An ``EarlyStopping`` threshold needs ``patience``: without it the callback stops
    whenever its trigger fires and reads nothing else."""
    return [((key,), "needs patience: without it EarlyStopping stops whenever its "
             "trigger fires (give patience = 3, as Lightning's default)")
            for key in ("stopping_threshold", "divergence_threshold")
            if key in args and "patience" not in args]


def _placeholder_problems(args: Mapping[str, Any]) -> list[tuple[Where, str]]:
    """Each ``{name}`` in a ``SendStat`` command is one of its metrics, step, epoch or
    run_dir."""
    known = [*args.get("metrics", []), "step", "epoch", "run_dir"]
    return [(("command", i), f"{{{field}}} is not in `metrics` {args.get('metrics', [])} "
             "(nor step, epoch, run_dir)")
            for i, arg in enumerate(args.get("command", []))
            for field in PLACEHOLDER_RE.findall(arg) if field not in known]


def _keep_shape(v: Any) -> bool:
    """A count or a table; the policy's own check names a count too large."""
    return (isinstance(v, int) and not isinstance(v, bool) and v >= 1) or isinstance(v, dict)


_KEEP = Param("keep", "a whole number >= 1 or a retention table such as { latest = 3 }",
              _keep_shape)


def _keep_problems(kind: SaverKind, args: Mapping[str, Any]) -> list[tuple[Where, str]]:
    """A saver's ``keep``: a policy, of rules that make sense for ``kind``, and for a
    ``TopKSaver`` not beside ``save_top_k``."""
    if "keep" not in args:
        return []
    if kind == "TopKSaver" and "save_top_k" in args:
        return [(("keep",), "give save_top_k or keep, not both (save_top_k = k is "
                            "keep = { best = k })")]
    monitor = args.get("monitor", "val/accuracy" if kind == "MaxSaver" else "val/loss")
    return saver_keep_problems(kind, args["keep"], monitor, args.get("mode", "min"))


#: ``torch.optim.lr_scheduler`` classes TOML can build (their arguments are plain values),
#: so ``schedtrain check`` knows them without torch; the tests compare it with torch's.
TORCH_SCHEDULERS: Final = frozenset({
    "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
    "ExponentialLR", "LinearLR", "MultiStepLR", "OneCycleLR", "PolynomialLR",
    "ReduceLROnPlateau", "StepLR"})

#: Built-in callback type name -> where it lives and its TOML arguments.
BUILTINS: Final[Mapping[str, Builtin]] = {
    "ModelSaver": Builtin("schedtrain.callbacks.saver:ModelSaver", (
        Param("keep", "a whole number >= 1 or a retention table such as { latest = 3 }",
              _keep_shape), _FOLDER),
        check=lambda args: policy_problems(args["keep"]) if "keep" in args else []),
    "MinSaver": Builtin("schedtrain.callbacks.saver:MinSaver", (
        _MONITOR, Param("filename", "a file name", _text), _FOLDER,
        Param("load_best_at_end", "true or false", _flag), _KEEP),
        check=lambda args: _keep_problems("MinSaver", args)),
    "MaxSaver": Builtin("schedtrain.callbacks.saver:MaxSaver", (
        _MONITOR, Param("filename", "a file name", _text), _FOLDER,
        Param("load_best_at_end", "true or false", _flag), _KEEP),
        check=lambda args: _keep_problems("MaxSaver", args)),
    "InferenceRunner": Builtin("schedtrain.callbacks.inference:InferenceRunner", (
        Param("prefix", "a metric prefix such as 'val'", is_name),
        Param("inferencers", "a list of tables such as { type = \"ClassificationError\", "
              "k = 5, name = \"val-error-top5\" }", lambda v: isinstance(v, list))),
        ("data", "loss_fn"), check=_inferencer_problems),
    "ScheduledHyperParamSetter": Builtin(
        "schedtrain.callbacks.hyperparam:ScheduledHyperParamSetter", (
            Param("param", "an optimizer param-group key such as 'lr'", _text, required=True),
            Param("schedule", "a non-empty list of [point, value] pairs of numbers", _pairs,
                  required=True),
            Param("interp", "'step', 'linear' or 'cosine'",
                  lambda v: v in ("step", "linear", "cosine")),
            Param("step_based", "true or false", _flag))),
    "EarlyStopping": Builtin("schedtrain.callbacks.stopping:EarlyStopping", (
        _MONITOR, Param("patience", "a whole number >= 1", _int(1)), _MODE,
        Param("min_delta", "a number >= 0", lambda v: _number(v) and v >= 0),
        Param("check_finite", "true or false", _flag),
        Param("stopping_threshold", "a finite number", _number),
        Param("divergence_threshold", "a finite number", _number)),
        check=_threshold_problems),
    "TerminateOnNaN": Builtin("schedtrain.callbacks.stopping:TerminateOnNaN"),
    "ProgressBar": Builtin("schedtrain.callbacks.progress:ProgressBar", (
        Param("names", "a list of metric names",
              lambda v: isinstance(v, list) and all(_text(n) for n in v)),
        Param("leave", "true or false", _flag), Param("tty_only", "true or false", _flag),
        Param("eta", "true or false", _flag))),
    "HumanHyperParamSetter": Builtin("schedtrain.callbacks.human:HumanHyperParamSetter", (
        Param("param", "an optimizer param-group key such as 'lr'", _text),
        Param("file", "a file name such as 'hyper.txt'", _text))),
    "SendStat": Builtin("schedtrain.callbacks.sendstat:SendStat", (
        Param("command", "a non-empty list of strings (the program and its arguments)",
              lambda v: _names(v) and bool(v), required=True),
        Param("metrics", "a list of metric names", _names),
        Param("timeout", "a number of seconds > 0", _seconds)), check=_placeholder_problems),
    "GPUUtilizationTracker": Builtin("schedtrain.callbacks.devicestats:GPUUtilizationTracker"),
    "DeviceStatsMonitor": Builtin("schedtrain.callbacks.devicestats:DeviceStatsMonitor"),
    "InjectShell": Builtin("schedtrain.callbacks.shell:InjectShell", (
        Param("file", "a file name such as 'shell'", _text),
        Param("shell", "'ipython' or 'python'", lambda v: v in ("ipython", "python"))),
        ("hook",)),
    "MovingAverageSummary": Builtin("schedtrain.callbacks.averages:MovingAverageSummary", (
        Param("metrics", "a non-empty list of metric names", lambda v: _names(v) and bool(v)),
        Param("decay", "a number in [0, 1)", lambda v: _number(v) and 0 <= v < 1),
        Param("suffix", "a non-empty string such as '_ema'", _text))),
    "LearningRateMonitor": Builtin("schedtrain.callbacks.optim:LearningRateMonitor", (
        Param("momentum", "true or false", _flag),)),
    "LRScheduler": Builtin("schedtrain.callbacks.optim:LRScheduler", (
        Param("scheduler", f"one of {', '.join(sorted(TORCH_SCHEDULERS))}, or "
              "'package.module:Class'",
              lambda v: _text(v) and (v in TORCH_SCHEDULERS or is_import_path(v)),
              required=True),
        Param("args", "a table of the scheduler's arguments, such as {T_max = 100}",
              lambda v: isinstance(v, dict) and all(k.isidentifier() for k in v)),
        _MONITOR)),
    "TopKSaver": Builtin("schedtrain.callbacks.topk:TopKSaver", (
        _MONITOR, _MODE, Param("save_top_k", "a whole number >= 0", _int(0)),
        Param("save_last", "true or false", _flag), _FOLDER, _KEEP),
        check=lambda args: _keep_problems("TopKSaver", args)),
    "PrintProgress": Builtin("schedtrain.callbacks.printing:PrintProgress", (),
                             ("stream",)),
    "PrintMetrics": Builtin("schedtrain.callbacks.printing:PrintMetrics", (
        Param("names", "a list of metric names",
              lambda v: isinstance(v, list) and all(_text(n) for n in v)),), ("stream",)),
    "GradientAccumulationScheduler": Builtin(
        "schedtrain.callbacks.optim:GradientAccumulationScheduler", (
            Param("schedule", "a table of epoch = micro-batches per step, such as "
                  "{0 = 1, 4 = 2}", lambda v: isinstance(v, dict) and bool(v) and all(
                      isinstance(k, str) and k.isdigit() and _int(1)(n)
                      for k, n in v.items()), required=True),)),
}

#: Parameters the schedule itself supplies, never written among a callback's arguments.
SUPPLIED: Final = frozenset({"trigger", "name"})


def is_known(name: str) -> bool:
    """Whether ``name`` is a built-in callback type (imports nothing)."""
    return name in BUILTINS


def is_import_path(name: str) -> bool:
    """Whether ``name`` has the shape ``"package.module:Class"`` (imports nothing)."""
    return IMPORT_PATH_RE.fullmatch(name) is not None


def check_builtin_arguments(name: str, args: Mapping[str, Any]) -> list[tuple[Where, str]]:
    """Check a built-in's TOML arguments without importing it.

    Returns:
        ``(where, message)`` for each unknown, wrong or missing argument: ``where`` is the
        argument's key path below the callback's table (``()`` for the table itself).
    """
    builtin = BUILTINS[name]
    problems: list[tuple[Where, str]] = []
    for key, message in _param_problems(name, builtin.params, args, builtin.python_only):
        problems.append(((key,) if key else (), message))
    if not problems and builtin.check is not None:
        problems.extend(builtin.check(args))
    return problems


def _param_problems(name: str, declared: tuple[Param, ...], args: Mapping[str, Any],
                    python_only: tuple[str, ...] = ()) -> list[tuple[str | None, str]]:
    params = {p.name: p for p in declared}
    problems: list[tuple[str | None, str]] = []
    for key, value in args.items():
        param = params.get(key)
        if key in python_only:
            problems.append((key, f"{name} takes {key!r} only from Python (a trainer "
                                  "argument or a task), not from TOML"))
        elif param is None:
            problems.append((key, f"unknown argument {key!r} for {name}"
                                  f"{did_you_mean(key, params)}; it takes "
                                  f"{', '.join(params) or 'no arguments'}"))
        elif not param.check(value):
            problems.append((key, f"expected {param.expected}, found {describe(value)}"))
    missing = [p.name for p in declared if p.required and p.name not in args]
    if missing:
        problems.append((None, f"{name} needs the argument{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(repr(m) for m in missing)}"))
    return problems


def resolve(type_name: str) -> type:
    """Import the ``Callback`` class a callback type names; nothing in it is called.

    Args:
        type_name: a built-in name (``"ModelSaver"``) or ``"package.module:Class"``.

    Raises:
        ValueError: the name is neither a built-in nor an import path.
        ImportError: the module or the class cannot be imported.
        TypeError: the name resolves to something that is not a ``Callback`` class.
    """
    builtin = BUILTINS.get(type_name)
    target = builtin.target if builtin is not None else type_name
    if not is_import_path(target):
        raise ValueError(
            f"unknown callback type {type_name!r}{did_you_mean(type_name, BUILTINS)}; "
            f"expected a built-in ({', '.join(BUILTINS)}) or 'package.module:Class'")
    # Named, not imported: the Callback base (and torch) load only with a callback class.
    return import_class(target, "schedtrain.callbacks.base:Callback", "a callback class")


def check_arguments(cls: type, args: Mapping[str, Any]) -> list[tuple[str | None, str]]:
    """Check a callback's TOML arguments against its class's ``__init__`` signature.

    Args:
        cls: the callback class.
        args: the arguments written in the spec (without ``type`` and ``trigger``).

    Returns:
        ``(argument or None, message)`` for each unknown argument and each missing
        required one; empty when the arguments fit.
    """
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return []
    params = sig.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = [
        n for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    problems: list[tuple[str | None, str]] = []
    if not takes_any:
        for key in args:
            if key not in accepted:
                choices = [n for n in accepted if n not in SUPPLIED]
                problems.append((key, (
                    f"unknown argument {key!r} for {cls.__name__}{did_you_mean(key, choices)}; "
                    f"it takes {', '.join(choices) or 'no arguments'}")))
    hints = argtypes.hints(cls)
    for key, value in args.items():
        if key in accepted and key in hints:
            wanted = argtypes.mismatch(hints[key], value)
            if wanted is not None:
                problems.append((key, f"expected {wanted} ({cls.__name__} declares "
                                      f"{key!r} so), found {describe(value)}"))
    missing = [
        n for n in accepted
        if params[n].default is inspect.Parameter.empty and n not in args and n not in SUPPLIED
    ]
    if missing:
        problems.append((None, (
            f"{cls.__name__} needs the argument{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)}")))
    return problems
