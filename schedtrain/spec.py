"""TOML schedules: load, check and write them.

A spec file mirrors DESIGN §5::

    [clock]                      # defaults for `plan` and simulation
    epochs = 10
    steps_per_epoch = 100

    [triggers.after_warmup]      # a named trigger, referenced by its name
    every = "1 epoch"
    start = "2 epochs"

    [callbacks.validate]
    type = "InferenceRunner"     # a built-in name or "package.module:Class"
    trigger = { any = ["after_warmup", { on = "train_end" }] }

Loading goes TOML text -> ``tomllib`` -> frozen attrs classes through one private
cattrs converter -> the core's ``Schedule``, which is compiled once to catch
what only the whole schedule shows (unknown events, triggers that can never
fire). Every problem is collected and raised at once as a ``SpecError`` whose
problems carry the file and the key path (``callbacks.validate.trigger.any[1].on``).

``"module:Class"`` types are only checked for shape here; the class is imported
when the schedule runs, or by ``Spec.callback_classes()`` (``schedtrain check --import``).
This module never imports torch.
"""

from __future__ import annotations

import math
import re
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    BaseValidationError,
    ForbiddenExtraKeysError,
    IterableValidationNote,
)

from schedtrain import registry
from schedtrain.errors import Problem, ScheduleError, ScheduleWarning, SpecError, did_you_mean
from schedtrain.events import BUILTIN_EVENTS, check_event_name
from schedtrain.schedule import Schedule
from schedtrain.time import Time
from schedtrain.triggers import (
    Trigger,
    all_of,
    any_of,
    at,
    every,
    improved,
    not_,
    on,
    parse_condition,
    plateau,
    when,
    window,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "CallbackSpec",
    "ClockSpec",
    "RunSpec",
    "Spec",
    "load_spec",
    "loads_spec",
]

#: Keys of a trigger table, in the order their parts are AND-ed.
TRIGGER_KEYS: Final = (
    "every", "offset", "at", "on", "start", "stop", "if", "improved", "plateau",
    "patience", "mode", "min_delta", "all", "any", "not",
)  # fmt: skip
_CALLBACK_KEYS: Final = ("type", "trigger")
_NAME_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_TASK_RE: Final = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_DEVICE_RE: Final = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps)$")

Seg: TypeAlias = str | int
"""One step of a key path: a table key or a list index."""


# -- the spec value types --------------------------------------------------------------


@attrs.frozen
class ClockSpec:
    """The ``[clock]`` table: run shape defaults for ``plan`` and simulation.

    Args:
        epochs: number of epochs.
        steps_per_epoch: optimizer steps per epoch.
        batches_per_step: micro-batches per optimizer step (gradient accumulation).
        samples_per_batch: samples each micro-batch adds to the ``sample`` counter.
        tokens_per_batch: tokens each micro-batch adds to the ``token`` counter.
        seconds_per_step: training wall time per optimizer step, for time triggers.
    """

    epochs: int | None = None
    steps_per_epoch: int | None = None
    batches_per_step: int | None = None
    samples_per_batch: int | None = None
    tokens_per_batch: int | None = None
    seconds_per_step: float | None = None


@attrs.frozen
class RunSpec:
    """The ``[run]`` table: what ``schedtrain train`` needs besides the schedule.

    Args:
        task: ``"module:function"`` building the model, data and optimizer.
        max_epochs: stop after this many epochs.
        max_steps: stop after this many optimizer steps.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        grad_accum: micro-batches per optimizer step.
        grad_clip: clip the gradient norm to this value.
        seed: random seed.
        run_dir: where checkpoints and logs go; default ``runs/<spec file stem>``.
    """

    task: str | None = None
    max_epochs: int | None = None
    max_steps: int | None = None
    device: str = "auto"
    precision: str = "fp32"
    grad_accum: int = 1
    grad_clip: float | None = None
    seed: int = 0
    run_dir: str | None = None


@attrs.frozen
class CallbackSpec:
    """One ``[callbacks.NAME]`` table.

    Args:
        type: a built-in name or ``"package.module:Class"``; ``None`` when the
            callback object is bound from Python by its name.
        args: the callback's own arguments (every other key of the table).
        trigger: when the callback runs.
    """

    type: str | None
    args: Mapping[str, Any]
    trigger: Trigger


@attrs.frozen
class Spec:
    """A loaded, checked TOML schedule.

    Args:
        callbacks: name -> callback, in declared order.
        triggers: the named ``[triggers.NAME]`` triggers.
        clock: planning defaults.
        run: the ``[run]`` table, if any.
        events: declared custom events.
        path: the file it was loaded from, if any.
        warnings: ``ScheduleWarning`` texts from compiling the schedule.
    """

    callbacks: Mapping[str, CallbackSpec]
    triggers: Mapping[str, Trigger] = attrs.field(factory=dict)
    clock: ClockSpec = ClockSpec()
    run: RunSpec | None = None
    events: tuple[str, ...] = ()
    path: str | None = None
    warnings: tuple[str, ...] = attrs.field(default=(), eq=False)

    def schedule(self) -> Schedule:
        """The core ``Schedule``: each callback by name, unbound (``callback=None``)."""
        return Schedule({n: cb.trigger for n, cb in self.callbacks.items()}, events=self.events)

    def callback_classes(self) -> dict[str, type]:
        """Import every typed callback's class and check its arguments.

        Raises:
            SpecError: a class cannot be imported, or arguments do not fit its signature.
        """
        problems: list[Problem] = []
        classes: dict[str, type] = {}
        for name, cb in self.callbacks.items():
            if cb.type is None:
                continue
            try:
                cls = registry.resolve(cb.type)
            except (ImportError, ValueError, TypeError) as exc:
                problems.append(Problem(f"callbacks.{name}.type", str(exc), self.path))
                continue
            classes[name] = cls
            for key, message in registry.check_arguments(cls, cb.args):
                path = f"callbacks.{name}" + (f".{key}" if key else "")
                problems.append(Problem(path, message, self.path))
        if problems:
            raise SpecError(problems)
        return classes


# -- raw documents and the converter ------------------------------------------------------


class _Invalid(Exception):
    """Raised by structuring hooks: problems with paths relative to the hooked value."""

    def __init__(self, problems: list[tuple[tuple[Seg, ...], str]]) -> None:
        super().__init__(problems)
        self.problems = problems


@attrs.frozen
class _Expr:
    """A trigger as written, before named references are resolved."""

    kind: Literal["ref", "leaf", "all", "any", "not"]
    rel: tuple[Seg, ...]
    name: str = ""
    trigger: Trigger | None = None
    children: tuple[_Expr, ...] = ()


@attrs.frozen
class _CallbackDoc:
    type: str | None
    args: dict[str, Any]
    trigger: _Expr


@attrs.frozen
class _Document:
    clock: ClockSpec = ClockSpec()
    run: RunSpec | None = None
    events: list[str] = attrs.field(factory=list)
    triggers: dict[str, _Expr] = attrs.field(factory=dict)
    callbacks: dict[str, _CallbackDoc] = attrs.field(factory=dict)


def describe(value: object) -> str:
    """How a TOML value reads in an error message: ``integer 5``, ``a table``."""
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"float {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, dict):
        return "a table" if value else "an empty table"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return f"{type(value).__name__} {value!r}"


def _fail(message: str) -> _Invalid:
    return _Invalid([((), message)])


def _strict_int(value: object, _t: object) -> int:
    # cattrs' default int hook is int(x): it would accept "10", 1.5 and true silently.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"expected an integer, found {describe(value)}")
    return value


def _strict_float(value: object, _t: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(f"expected a number, found {describe(value)}")
    return float(value)


def _strict_str(value: object, _t: object) -> str:
    if not isinstance(value, str):
        raise _fail(f"expected a string, found {describe(value)}")
    return value


def _expr_hook(value: object, _t: object) -> _Expr:
    problems: list[tuple[tuple[Seg, ...], str]] = []
    expr = _parse_trigger(value, (), problems)
    if problems or expr is None:
        raise _Invalid(problems)
    return expr


def _callback_hook(value: object, _t: object) -> _CallbackDoc:
    if not isinstance(value, dict):
        raise _fail(f"expected a table with `type`, `trigger` and arguments, found "
                    f"{describe(value)}")
    problems: list[tuple[tuple[Seg, ...], str]] = []
    type_name = value.get("type")
    args = {k: v for k, v in value.items() if k not in _CALLBACK_KEYS}
    if type_name is not None:
        if not isinstance(type_name, str):
            problems.append((("type",), f"expected a string such as 'ModelSaver' or "
                                        f"'package.module:Class', found {describe(type_name)}"))
        elif ":" in type_name:
            if not registry.is_import_path(type_name):
                problems.append((("type",), f"invalid import path {type_name!r}: expected "
                                            "'package.module:Class'"))
        elif not registry.is_known(type_name):
            problems.append((("type",), (
                f"unknown callback type {type_name!r}{did_you_mean(type_name, registry.BUILTINS)}"
                f"; expected a built-in ({', '.join(registry.BUILTINS)}) or "
                "'package.module:Class'")))
    else:
        # Without a type the callback is bound from Python, so any other key is a typo.
        for key in args:
            problems.append(((key,), (
                f"unknown key {key!r}{did_you_mean(key, _CALLBACK_KEYS)}; a callback without "
                "`type` is bound from Python by its name and takes no arguments here")))
    expr: _Expr | None = None
    if "trigger" not in value:
        near = [k for k in value if did_you_mean(k, ["trigger"])]
        hint = f" (found {near[0]!r})" if near else ""
        problems.append((("trigger",), (
            f"missing key 'trigger'{hint}: every callback needs one, e.g. "
            "trigger = { every = \"1 epoch\" }")))
    else:
        expr = _parse_trigger(value["trigger"], ("trigger",), problems)
    if problems or expr is None:
        raise _Invalid(problems)
    return _CallbackDoc(type_name if isinstance(type_name, str) else None, args, expr)


_converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
_converter.register_structure_hook(int, _strict_int)
_converter.register_structure_hook(float, _strict_float)
_converter.register_structure_hook(str, _strict_str)
_converter.register_structure_hook(_Expr, _expr_hook)
_converter.register_structure_hook(_CallbackDoc, _callback_hook)


# -- trigger tables ------------------------------------------------------------------------


def _time(value: object, rel: tuple[Seg, ...], key: str,
          problems: list[tuple[tuple[Seg, ...], str]]) -> Time | None:
    if not isinstance(value, str):
        problems.append((rel, f"expected a time such as '500 steps', '2 epochs' or '30 min', "
                              f"found {describe(value)}"))
        return None
    try:
        return Time.parse(value)
    except ValueError as exc:
        problems.append((rel, str(exc)))
        return None


def _metric(value: object, rel: tuple[Seg, ...],
            problems: list[tuple[tuple[Seg, ...], str]]) -> str | None:
    if not isinstance(value, str) or not value.strip():
        problems.append((rel, "expected a metric name such as 'val/loss', found "
                              f"{describe(value)}"))
        return None
    return value


def _leaf(trigger: Trigger, rel: tuple[Seg, ...]) -> _Expr:
    return _Expr("leaf", rel, trigger=trigger)


def _parse_trigger(
    value: object, rel: tuple[Seg, ...], problems: list[tuple[tuple[Seg, ...], str]]
) -> _Expr | None:
    """A trigger as written (a table or a name); appends problems with relative paths."""
    if isinstance(value, str):
        if not _NAME_RE.match(value):
            hint = ""
            try:
                Time.parse(value)
                hint = f"; to fire periodically write {{ every = {value!r} }}"
            except ValueError:
                pass
            problems.append((rel, f"expected a trigger table or the name of a [triggers] "
                                  f"entry, found {describe(value)}{hint}"))
            return None
        return _Expr("ref", rel, name=value)
    if not isinstance(value, dict):
        problems.append((rel, "expected a trigger table such as { every = \"500 steps\" } or "
                              f"the name of a [triggers] entry, found {describe(value)}"))
        return None
    if not value:
        problems.append((rel, "expected a trigger table with at least one of "
                              f"{', '.join(k for k in TRIGGER_KEYS if k not in _MODIFIERS)}; "
                              "found an empty table"))
        return None
    start = len(problems)
    for key in value:
        if key not in TRIGGER_KEYS:
            problems.append(((*rel, key), f"unknown trigger key {key!r}"
                                          f"{did_you_mean(key, TRIGGER_KEYS)}; expected one of "
                                          f"{', '.join(TRIGGER_KEYS)}"))
    parts: list[_Expr] = []
    _periodic_parts(value, rel, problems, parts)
    _metric_parts(value, rel, problems, parts)
    combos: tuple[Literal["all", "any"], ...] = ("all", "any")
    for key in combos:
        if key in value:
            items = value[key]
            if not isinstance(items, list) or not items:
                problems.append(((*rel, key), f"expected a non-empty list of triggers, found "
                                              f"{describe(items)}"))
                continue
            kids = [_parse_trigger(item, (*rel, key, i), problems) for i, item in enumerate(items)]
            if all(k is not None for k in kids):
                parts.append(_Expr(key, (*rel, key), children=tuple(k for k in kids if k)))
    if "not" in value:
        kid = _parse_trigger(value["not"], (*rel, "not"), problems)
        if kid is not None:
            parts.append(_Expr("not", (*rel, "not"), children=(kid,)))
    if len(problems) > start:
        return None
    if not parts:
        problems.append((rel, "a trigger table needs at least one of "
                              f"{', '.join(k for k in TRIGGER_KEYS if k not in _MODIFIERS)}"))
        return None
    return parts[0] if len(parts) == 1 else _Expr("all", rel, children=tuple(parts))


_MODIFIERS: Final = ("offset", "patience", "mode", "min_delta")


def _periodic_parts(value: dict[str, Any], rel: tuple[Seg, ...],
                    problems: list[tuple[tuple[Seg, ...], str]], parts: list[_Expr]) -> None:
    if "every" in value:
        period = _time(value["every"], (*rel, "every"), "every", problems)
        offset = (_time(value["offset"], (*rel, "offset"), "offset", problems)
                  if "offset" in value else None)
        if period is not None and ("offset" not in value or offset is not None):
            try:
                parts.append(_leaf(every(period, offset=offset), (*rel, "every")))
            except (TypeError, ValueError) as exc:
                where = "offset" if "offset" in str(exc) else "every"
                problems.append(((*rel, where), str(exc).replace("`every` needs", "needs")))
    elif "offset" in value:
        problems.append(((*rel, "offset"), "`offset` shifts the grid of `every`; add `every` "
                                           "or remove `offset`"))
    if "at" in value:
        raw = value["at"]
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            problems.append(((*rel, "at"), "expected a time or a non-empty list of times, "
                                           "found an empty list"))
        points = [_time(p, (*rel, "at", i) if isinstance(raw, list) else (*rel, "at"), "at",
                        problems) for i, p in enumerate(items)]
        if items and all(p is not None for p in points):
            try:
                parts.append(_leaf(at([p for p in points if p is not None]), (*rel, "at")))
            except ValueError as exc:
                problems.append(((*rel, "at"), str(exc)))
    if "on" in value:
        event = value["on"]
        try:
            parts.append(_leaf(on(check_event_name(event)), (*rel, "on")))
        except ValueError:
            problems.append(((*rel, "on"), (
                f"expected an event name such as 'train_end' or a declared custom event, "
                f"found {describe(event)}")))
    if "start" in value or "stop" in value:
        lo = _time(value["start"], (*rel, "start"), "start", problems) if "start" in value else None
        hi = _time(value["stop"], (*rel, "stop"), "stop", problems) if "stop" in value else None
        if ("start" not in value or lo is not None) and ("stop" not in value or hi is not None):
            try:
                parts.append(_leaf(window(lo, hi), (*rel, "start" if lo is not None else "stop")))
            except ValueError as exc:
                problems.append(((*rel, "stop"), str(exc)))
    if "if" in value:
        text = value["if"]
        if not isinstance(text, str):
            problems.append(((*rel, "if"), f"expected condition text such as 'val/loss < 0.5', "
                                           f"found {describe(text)}"))
        else:
            try:
                parse_condition(text)  # parsed by the core grammar, never evaluated
                parts.append(_leaf(when(text), (*rel, "if")))
            except ValueError as exc:
                problems.append(((*rel, "if"), str(exc)))


def _metric_parts(value: dict[str, Any], rel: tuple[Seg, ...],
                  problems: list[tuple[tuple[Seg, ...], str]], parts: list[_Expr]) -> None:
    has_imp, has_plat = "improved" in value, "plateau" in value
    if has_imp and has_plat:
        problems.append(((*rel, "plateau"), "`improved` and `plateau` in one table would share "
                                            "`mode` and `min_delta`; combine two tables with "
                                            "all = [...] or any = [...]"))
        return
    if not (has_imp or has_plat):
        for key in ("mode", "min_delta", "patience"):
            if key in value:
                problems.append(((*rel, key), f"`{key}` belongs to `improved` or `plateau`; "
                                              "add one of them or remove it"))
        return
    key = "improved" if has_imp else "plateau"
    metric = _metric(value[key], (*rel, key), problems)
    ok = metric is not None
    mode = value.get("mode", "min")
    if mode not in ("min", "max"):
        problems.append(((*rel, "mode"), f"expected 'min' or 'max', found {describe(mode)}"))
        ok = False
    delta = value.get("min_delta", 0.0)
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not delta >= 0:
        problems.append(((*rel, "min_delta"), f"expected a number >= 0, found {describe(delta)}"))
        ok = False
    if has_imp:
        if "patience" in value:
            problems.append(((*rel, "patience"), "`patience` belongs to `plateau`, not "
                                                 "`improved`"))
            ok = False
        if ok and metric is not None:
            parts.append(_leaf(improved(metric, mode, float(delta)), (*rel, key)))
        return
    if "patience" not in value:
        problems.append(((*rel, "patience"), "missing key 'patience': `plateau` needs the number "
                                             "of new values without improvement, e.g. "
                                             "patience = 3"))
        return
    patience = value["patience"]
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        problems.append(((*rel, "patience"), f"expected a whole number >= 1, found "
                                             f"{describe(patience)}"))
        return
    if ok and metric is not None:
        parts.append(_leaf(plateau(metric, patience, mode, float(delta)), (*rel, key)))


# -- resolution: named references, then the core's compile check -----------------------------


def _path(segs: Sequence[Seg]) -> str:
    out = ""
    for s in segs:
        if isinstance(s, int):
            out += f"[{s}]"
        else:
            out += f".{s}" if out else s
    return out


class _Resolver:
    """Turns ``_Expr`` trees into core triggers; references may nest, cycles are errors."""

    def __init__(self, named: Mapping[str, _Expr], problems: list[Problem],
                 file: str | None) -> None:
        self.named = named
        self.problems = problems
        self.file = file
        self.done: dict[str, Trigger | None] = {}
        self.stack: list[str] = []
        #: id(core trigger) -> the key path where it was written, to relocate core errors.
        self.origin: dict[int, str] = {}

    def named_trigger(self, name: str) -> Trigger | None:
        if name not in self.done:
            self.stack.append(name)
            self.done[name] = self.resolve(self.named[name], ("triggers", name))
            self.stack.pop()
        return self.done[name]

    def resolve(self, expr: _Expr, base: tuple[Seg, ...]) -> Trigger | None:
        where = _path((*base, *expr.rel))
        result: Trigger | None
        if expr.kind == "ref":
            return self._ref(expr.name, where)
        if expr.kind == "leaf":
            result = expr.trigger
        else:
            kids = [self.resolve(c, base) for c in expr.children]
            if any(k is None for k in kids):
                return None
            ts = [k for k in kids if k is not None]
            result = (all_of(*ts) if expr.kind == "all" else any_of(*ts) if expr.kind == "any"
                      else not_(ts[0]))
        if result is not None:
            self.origin.setdefault(id(result), where)
        return result

    def _ref(self, name: str, where: str) -> Trigger | None:
        if name not in self.named:
            hint = did_you_mean(name, self.named)
            self.problems.append(Problem(where, (
                f"unknown trigger {name!r}{hint}; a string names a [triggers.{name}] table"
                + ("" if self.named else " and this spec defines none")), self.file))
            return None
        if name in self.stack:
            cycle = " -> ".join([*self.stack[self.stack.index(name):], name])
            self.problems.append(Problem(where, f"cyclic trigger reference: {cycle}", self.file))
            self.done[name] = None
            return None
        if name in self.done:
            return self.done[name]
        return self.named_trigger(name)

    def relocate(self, problem: Problem, schedule: Schedule) -> Problem:
        """Map a core problem path (``callbacks.x.trigger.all[1]``) to where it was written."""
        m = re.match(r"^callbacks\.(.+?)\.trigger((?:\.all\[\d+\]|\.any\[\d+\]|\.not)*)$",
                     problem.path)
        path = problem.path
        if m is not None and m[1] in schedule.names:
            node: Trigger = schedule[m[1]]
            for step in re.findall(r"\.(all|any)\[(\d+)\]|\.(not)", m[2]):
                kids = node.children()
                node = kids[int(step[1])] if step[0] else kids[0]
            path = self.origin.get(id(node), path)
        return Problem(path, problem.message, self.file)


def _collect(exc: BaseException, path: tuple[Seg, ...]) -> Iterator[tuple[tuple[Seg, ...], str]]:
    """Flatten a cattrs error tree into ``(path, message)`` pairs."""
    if isinstance(exc, _Invalid):
        for rel, message in exc.problems:
            yield (*path, *rel), message
    elif isinstance(exc, ForbiddenExtraKeysError):
        fields = [a.name for a in attrs.fields(exc.cl)]
        for key in sorted(exc.extra_fields):
            yield (*path, key), (f"unknown key {key!r}{did_you_mean(key, fields)}; expected one "
                                 f"of {', '.join(fields)}")
    elif isinstance(exc, BaseValidationError):
        for sub in exc.exceptions:
            seg: tuple[Seg, ...] = ()
            for note in getattr(sub, "__notes__", []):
                if isinstance(note, AttributeValidationNote):
                    seg = (note.name,)
                elif isinstance(note, IterableValidationNote):
                    seg = (note.index,)
            yield from _collect(sub, (*path, *seg))
    elif isinstance(exc, KeyError):
        yield path, f"missing key {exc.args[0]!r}"
    else:
        yield path, f"expected {_expected(exc)}"


def _expected(exc: BaseException) -> str:
    text = str(exc)
    if "not iterable" in text or "object is not" in text:
        return f"a different type ({text})"
    return text or type(exc).__name__


def _check_clock(clock: ClockSpec) -> Iterator[tuple[str, str]]:
    for key in ("epochs", "steps_per_epoch", "batches_per_step"):
        v = getattr(clock, key)
        if v is not None and v < 1:
            yield f"clock.{key}", f"expected a whole number >= 1, found {v}"
    for key in ("samples_per_batch", "tokens_per_batch", "seconds_per_step"):
        v = getattr(clock, key)
        if v is not None and (v < 0 or not math.isfinite(v)):
            yield f"clock.{key}", f"expected a number >= 0, found {v}"


def _check_run(run: RunSpec) -> Iterator[tuple[str, str]]:
    if run.task is not None and not _TASK_RE.match(run.task):
        yield "run.task", f"expected 'module:function', found {run.task!r}"
    for key in ("max_epochs", "max_steps", "grad_accum"):
        v = getattr(run, key)
        if v is not None and v < 1:
            yield f"run.{key}", f"expected a whole number >= 1, found {v}"
    if not _DEVICE_RE.match(run.device):
        yield "run.device", ("expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', found "
                             f"{run.device!r}")
    if run.precision not in ("fp32", "bf16", "fp16"):
        yield "run.precision", f"expected 'fp32', 'bf16' or 'fp16', found {run.precision!r}"
    if run.grad_clip is not None and not (run.grad_clip > 0 and math.isfinite(run.grad_clip)):
        yield "run.grad_clip", f"expected a number > 0, found {run.grad_clip!r}"


def _from_data(data: dict[str, Any], file: str | None) -> Spec:
    """Structure, resolve and compile a parsed TOML document."""
    try:
        doc = _converter.structure(data, _Document)
    except Exception as exc:
        raise SpecError([Problem(_path(p), m, file) for p, m in _collect(exc, ())]) from None
    problems: list[Problem] = [Problem(p, m, file) for p, m in _check_clock(doc.clock)]
    if doc.run is not None:
        problems += [Problem(p, m, file) for p, m in _check_run(doc.run)]
    for i, event in enumerate(doc.events):
        if event in BUILTIN_EVENTS:
            problems.append(Problem(f"events[{i}]", f"{event!r} is a built-in event; declare "
                                                    "only custom ones", file))
        elif not _NAME_RE.match(event):
            problems.append(Problem(f"events[{i}]", f"invalid event name {event!r}: use letters, "
                                                    "digits, '_', '-', '.'", file))
    for name in [*doc.triggers, *doc.callbacks]:
        if not _NAME_RE.match(name):
            kind = "triggers" if name in doc.triggers else "callbacks"
            problems.append(Problem(f"{kind}.{name}", f"invalid name {name!r}: use letters, "
                                                      "digits, '_', '-', '.' and start with a "
                                                      "letter or '_'", file))
    resolver = _Resolver(doc.triggers, problems, file)
    for name in doc.triggers:
        resolver.named_trigger(name)
    callbacks: dict[str, CallbackSpec] = {}
    for name, cb in doc.callbacks.items():
        trigger = resolver.resolve(cb.trigger, ("callbacks", name))
        if trigger is not None:
            callbacks[name] = CallbackSpec(cb.type, cb.args, trigger)
    if not doc.callbacks:
        problems.append(Problem("callbacks", "a spec needs at least one [callbacks.NAME] table",
                                file))
    if problems:
        raise SpecError(problems)
    run = doc.run
    if run is not None and run.run_dir is None:
        stem = Path(file).stem if file and not file.startswith("<") else "schedule"
        run = attrs.evolve(run, run_dir=f"runs/{stem}")
    named = {n: t for n, t in resolver.done.items() if t is not None}
    spec = Spec(callbacks, named, doc.clock, run, tuple(doc.events), file)
    schedule = spec.schedule()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ScheduleWarning)
        try:
            schedule.compile()
        except ScheduleError as exc:
            moved = [resolver.relocate(p, schedule) for p in exc.problems]
            raise SpecError(list(dict.fromkeys(moved))) from None
    notes = tuple(str(w.message) for w in caught if issubclass(w.category, ScheduleWarning))
    return attrs.evolve(spec, warnings=notes)


def loads_spec(text: str, file: str = "<string>") -> Spec:
    """Load a TOML schedule from text.

    Args:
        text: the TOML document.
        file: a name for error messages.

    Raises:
        SpecError: listing every problem with its key path (and line and column for
            TOML syntax errors).
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError([Problem("", f"invalid TOML: {exc}", file)]) from None
    return _from_data(data, file)


def load_spec(path: str | Path) -> Spec:
    """Load a TOML schedule from a file; see ``loads_spec``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecError([Problem("", f"cannot read the spec: {reason}", str(path))]) from None
    return loads_spec(text, str(path))
