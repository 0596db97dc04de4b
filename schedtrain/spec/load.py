"""Loading a spec: read (TOML) -> validate (tables, types, ranges) -> build (triggers, checks).

Every problem found is reported at once, as a ``SpecError`` whose problems carry the
file, the key path, what was expected and what was found. The static checks run once,
here; the resulting ``Spec.schedule()`` carries their result so compiling it does not
repeat them. Nothing a spec names is imported unless ``imports=True``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from schedtrain.errors import Problem, SpecError
from schedtrain.imports import add_user_paths
from schedtrain.schedule.analysis import analyze
from schedtrain.schedule.collector import collector_paused
from schedtrain.spec.callbacks import read_callback
from schedtrain.spec.direction import direction_notes
from schedtrain.spec.document import parse_toml, read_document
from schedtrain.spec.failures import check_auto_triggers, rate_needed
from schedtrain.spec.hints import with_hints
from schedtrain.spec.metrics import check_early_stopping
from schedtrain.spec.model import CallbackSpec, Spec
from schedtrain.spec.problems import Problems
from schedtrain.spec.run import from_checked
from schedtrain.spec.triggers import TriggerReader

__all__ = ["default_run_dir", "load_spec", "loads_spec", "read_spec"]


def default_run_dir(file: str | None) -> str:
    """``train``'s run directory where neither ``--run-dir`` nor ``[run] run_dir`` names one:
    ``runs/<spec stem>`` (``runs/schedule`` for a spec not read from a file)."""
    stem = Path(file).stem if file and not file.startswith("<") else "schedule"
    return f"runs/{stem}"


def loads_spec(text: str, file: str = "<string>", *, imports: bool = False,
               schedule_only: bool = False) -> Spec:
    """Load a TOML schedule from text.

    Args:
        text: the TOML document.
        file: a name for error messages.
        imports: import the classes of custom triggers (``{ custom = "pkg.mod:Class" }``);
            without it they load as placeholders that cannot be simulated.
        schedule_only: a document without ``[run]`` is a schedule whose run is
            configured elsewhere (a checkpoint's stored schedule, a running job's, a
            retime's new one): the checks that read ``[run]`` (``every = "auto"`` needs
            ``mtbf``) are its run's. One with ``[run]`` is checked as ever.

    Raises:
        SpecError: listing every problem with its key path (and line and column for
            TOML syntax errors).
    """
    with collector_paused():  # everything loading builds stays alive: nothing to collect
        return _loads_spec(text, file, imports=imports, schedule_only=schedule_only)


def _loads_spec(text: str, file: str, *, imports: bool, schedule_only: bool) -> Spec:
    if imports:
        # Validate everything first: no module a spec names is imported (and run) for a
        # spec that is refused anyway.
        loads_spec(text, file, imports=False, schedule_only=schedule_only)
        add_user_paths(file)
    problems = Problems(file, imports)
    data = parse_toml(text, problems)
    problems.raise_if_any()
    assert data is not None
    return _spec(data, file, problems, schedule_only=schedule_only)


def read_spec(data: dict[str, Any], file: str = "<string>", *,
              schedule_only: bool = False) -> Spec:
    """``loads_spec`` of a document already parsed (``parse_toml``'s dict, which is not
    changed), nothing imported: a stored schedule parsed once is read, not parsed again.

    Raises:
        SpecError: listing every problem with its key path.
    """
    with collector_paused():
        return _spec(data, file, Problems(file, False), schedule_only=schedule_only)


def _spec(data: dict[str, Any], file: str, problems: Problems, *, schedule_only: bool) -> Spec:
    doc = read_document(data, problems)
    if doc is None:
        problems.raise_if_any()
    assert doc is not None
    reader = TriggerReader(doc.triggers, problems)
    for name in doc.triggers:
        reader.named_trigger(name)
    callbacks: dict[str, CallbackSpec] = {}
    located = {}
    for name, table in doc.callbacks.items():
        got = read_callback(name, table, reader, problems)
        if got is not None:
            type_name, args, loc = got
            callbacks[name] = CallbackSpec(type_name, args, loc.trigger)
            located[name] = loc
    if not doc.callbacks:
        problems.add("callbacks", "a spec needs at least one [callbacks.NAME] table",
                     expected="a [callbacks.NAME] table", found="none")
    types = {n: c.type for n, c in callbacks.items() if c.type is not None}
    check_auto_triggers(located, types, rate_needed(data, schedule_only=schedule_only),
                        problems)
    if problems.items:  # the call only where it raises (a live retime checks here)
        problems.raise_if_any()
    analysis = with_hints(analyze(list(located.items()), doc.events, file=file),
                          located.values())
    if analysis.problems:
        raise SpecError(list(dict.fromkeys(analysis.problems)))
    run = doc.run
    if run is not None and run.run_dir is None:
        run = attrs.evolve(run, run_dir=default_run_dir(file))
    config = from_checked(run) if run is not None else None
    named = {n: loc.trigger for n, loc in reader.done.items() if loc is not None}
    # A named trigger used in several places is warned about once.
    spec = Spec(callbacks, named, doc.clock, config, doc.events, file,
                tuple(dict.fromkeys(analysis.notes)), analysis, located)
    stops = check_early_stopping(spec)
    if stops:
        raise SpecError(stops)
    return attrs.evolve(spec, warnings=(*spec.warnings, *direction_notes(spec)))


def load_spec(path: str | Path, *, imports: bool = False,
              schedule_only: bool = False) -> Spec:
    """Load a TOML schedule from a file; see ``loads_spec``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecError([Problem("", f"cannot read the spec: {reason}", str(path))]) from None
    return loads_spec(text, str(path), imports=imports, schedule_only=schedule_only)
