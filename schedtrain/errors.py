"""The library's exceptions and warnings.

Factored out so every module can raise them without import cycles. Errors carry
data (the argument or key path, what was expected, what was found) from where
they are raised; nothing downstream parses their text.
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

import attrs

__all__ = [
    "ArgumentError",
    "Error",
    "PortingWarning",
    "Preempted",
    "Problem",
    "RunDirError",
    "RunEnded",
    "ScheduleError",
    "ScheduleWarning",
    "SpecError",
    "StopTraining",
    "describe",
    "did_you_mean",
    "failure_place",
    "int_text",
    "locate_failure",
    "number_text",
    "one_line",
    "shorten",
    "summarized",
    "traceback_file",
    "with_head",
]

#: The longest line a message prints, ``error: FILE: KEY PATH:`` included (longer
#: messages are cut in the middle); a screen line, not a page.
MESSAGE_LIMIT: Final = 300
#: The longest key path (and file name) one problem prints.
PATH_LIMIT: Final = 100
#: The longest head a problem's line gets before its file: ``warning: ``.
_HEAD: Final = len("warning: ")
#: The least of a message a line keeps, however long its file and key path.
_LEAST: Final = 80
#: Digits past which a number a user wrote is named by its digit count, never converted:
#: Python refuses more than 4,300 in its own words, and no count schedtrain takes has
#: more than 19.
MAX_DIGITS: Final = 100
_DIGIT_RUN: Final = re.compile(r"\d[\d_]*")
#: Problems ``str(ScheduleError)`` lists before "... and N more".
SHOWN_PROBLEMS: Final = 20
_LONG_WORD: Final = re.compile(r"\S{81,}")
_LONG_QUOTED: Final = re.compile(r"['\"]\S{80,}")
_BREAKS: Final = re.compile(r"[\r\n\t\v\f\x00-\x08\x0e-\x1f\x7f]+")


def shorten(text: str, limit: int = 60) -> str:
    """``text`` if at most ``limit`` characters, else its start and end around ``...``
    and its length: a value echoed in a message stays readable."""
    if len(text) <= limit:
        return text
    tail = max(limit // 5, 1)
    return f"{text[:limit - tail]}...{text[-tail:]} ({len(text):,} characters)"


def _shorten_quoted(text: str) -> str:
    """A long quoted value shortened; of a path, its file name stays whole (it says which
    checkpoint or file is meant)."""
    folder, sep, name = text.rpartition("/")
    if sep and folder and len(name) <= 60:
        return f"{folder[:20]}...{sep}{name}"
    return shorten(text)


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` as one line of at most about ``limit`` characters: line breaks and
    control characters become spaces, quoted values longer than 80 characters are
    shortened; a line still too long gets its other long words shortened too, then is
    cut in the middle. Within the limit, unquoted words stay whole (the folders a lookup
    names, however deep)."""
    text = _BREAKS.sub(" ", text)
    text = _LONG_QUOTED.sub(lambda m: _shorten_quoted(m[0]), text)
    if len(text) <= limit:
        return text
    text = _LONG_WORD.sub(lambda m: shorten(m[0]), text)
    if len(text) > limit:
        tail = limit // 4
        text = f"{text[:limit - tail - 5]} ... {text[-tail:]}"
    return text


def with_head(head: str, text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``head`` then ``text`` as one line of at most ``limit`` characters: ``text`` is
    cut (``one_line``) to what ``head`` leaves, keeping at least 80 characters of it."""
    return head + one_line(text, max(limit - len(head), _LEAST))


def number_text(text: str) -> str | None:
    """``"a number of 5,000 digits"`` when ``text`` holds a number of more than
    ``MAX_DIGITS`` digits (``_`` separators not counted), else ``None``: checked before
    ``int()``, ``float()`` or ``Fraction()`` read what a user wrote."""
    if len(text) <= MAX_DIGITS:
        return None
    longest = max((len(m[0].replace("_", "")) for m in _DIGIT_RUN.finditer(text)), default=0)
    return f"a number of {longest:,} digits" if longest > MAX_DIGITS else None


def summarized(lines: Sequence[str], limit: int = SHOWN_PROBLEMS,
               more: str = "more") -> list[str]:
    """The first ``limit`` of ``lines``, each ``one_line``, then ``... and N more``: a
    report of thousands of items stays a screen of readable lines."""
    shown = [one_line(line) for line in lines[:limit]]
    if len(lines) > limit:
        shown.append(f"... and {len(lines) - limit:,} {more}")
    return shown


@attrs.frozen
class Problem:
    """One thing wrong with a schedule, located by its key path.

    Args:
        path: where the problem is, e.g. ``callbacks.validate.trigger.any[1].every``.
        message: what was expected and what was found, as a sentence.
        file: the spec file, when the schedule came from one.
        expected: what a valid value looks like, when one value is at fault.
        found: what was there instead.
    """

    path: str
    message: str
    file: str | None = None
    expected: str | None = attrs.field(default=None, kw_only=True)
    found: str | None = attrs.field(default=None, kw_only=True)

    def __str__(self) -> str:
        """One line of at most ``MESSAGE_LIMIT`` characters with ``warning: `` before it:
        the file, the key path and the message (a long file, path or message is cut in
        the middle; the attributes keep them whole)."""
        where = f"{one_line(self.file, PATH_LIMIT)}: " if self.file else ""
        head = f"{where}{one_line(self.path, PATH_LIMIT)}: " if self.path else where
        return with_head(head, self.message, MESSAGE_LIMIT - _HEAD)


class Error(Exception):
    """The base of every exception schedtrain raises on purpose: ``except schedtrain.Error``
    catches a bad schedule, spec, argument, checkpoint, plan, host or run directory, a
    preemption and a stop, and nothing else (a bug of the library or of the user's own
    code keeps its own type)."""


class ArgumentError(Error, ValueError):
    """A bad argument to a trigger factory or value type.

    Attributes:
        argument: the parameter at fault (``"period"``, ``"offset"``, ``"stop"``).
        expected: what a valid value looks like.
        found: what was given, as text.
    """

    def __init__(self, argument: str, message: str, *, expected: str | None = None,
                 found: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument
        self.expected = expected
        self.found = found


class ScheduleError(Error, ValueError):
    """A schedule that cannot run; lists every problem found, each with its key path."""

    def __init__(self, problems: Sequence[Problem] | str) -> None:
        if isinstance(problems, str):
            problems = (Problem("", problems),)
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        if len(self.problems) == 1:
            return str(self.problems[0])
        lines = [f"{len(self.problems)} problems:"]
        lines += [f"  - {p}" for p in self.problems[:SHOWN_PROBLEMS]]
        if len(self.problems) > SHOWN_PROBLEMS:
            lines.append(f"  ... and {len(self.problems) - SHOWN_PROBLEMS} more")
        return "\n".join(lines)


class SpecError(ScheduleError):
    """A TOML schedule that is malformed; lists every problem with file and key path."""


class ScheduleWarning(UserWarning):
    """A schedule that will run but probably not as meant (e.g. a metric nobody produces)."""


class PortingWarning(UserWarning):
    """A callback written for tensorpack, pytorch-accelerated or Lightning defines a hook
    schedtrain never calls; the message names what to write instead."""


class StopTraining(Error):
    """Raised by a callback to end training cleanly; train-end callbacks still run."""


class RunDirError(Error):
    """A run directory that cannot be used as asked (in use, holds a run, finished)."""


class RunEnded(RunDirError):
    """Resuming a run that already ended (finished, or stopped) with nothing left to do.

    ``schedtrain train --resume auto`` treats it as success, so a job that is requeued
    after it finished ends at once instead of failing.

    Attributes:
        status: ``"finished"`` or ``"stopped"``.
        step: the step it ended at.
    """

    def __init__(self, message: str, *, status: str, step: int) -> None:
        super().__init__(message)
        self.status, self.step = status, step


class Preempted(Error):
    """Training stopped on SIGTERM or SIGINT, after the current step and a checkpoint.

    Attributes:
        signal: the signal's name (``"SIGTERM"``).
        step: the last completed step.
        checkpoint: the checkpoint written (``None`` if the run has no run directory;
            its URL when ``checkpoint_dir`` is one).
    """

    def __init__(self, signal: str, step: int, checkpoint: Path | str | None) -> None:
        where = (f"checkpoint {checkpoint}; resume with --resume auto" if checkpoint
                 else "no checkpoint (the trainer has no run_dir)")
        super().__init__(f"preempted by {signal} after step {step}: {where}")
        self.signal, self.step, self.checkpoint = signal, step, checkpoint


_PLACE = "schedtrain_place"


def locate_failure(exc: BaseException, place: str) -> None:
    """Say where in the run ``exc`` was raised (``"callback 'x' at step_end, step 12,
    epoch 1"``), once: the innermost place wins. Added as a note to its traceback."""
    if getattr(exc, _PLACE, None) is not None:
        return
    # An exception class with __slots__ takes no attribute: the note still says it.
    with contextlib.suppress(AttributeError):
        setattr(exc, _PLACE, place)
    exc.add_note(f"schedtrain: raised in {place}")


def failure_place(exc: BaseException) -> str | None:
    """Where ``locate_failure`` placed ``exc``, if it did."""
    place = getattr(exc, _PLACE, None)
    return place if isinstance(place, str) else None


_TRACEBACK = "schedtrain_traceback_file"


def traceback_file(exc: BaseException, path: Path | None = None) -> Path | None:
    """The file ``exc``'s traceback was saved to; with ``path``, record it first."""
    if path is not None:
        try:
            setattr(exc, _TRACEBACK, path)
        except AttributeError:
            return None
    saved = getattr(exc, _TRACEBACK, None)
    return saved if isinstance(saved, Path) else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return `` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    if len(word) > 200:  # no name is close to it, and comparing costs its length squared
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def int_text(value: int, limit: int = 30) -> str:
    """An integer's digits, shortened past ``limit``; one too long for Python to print
    (over 4,300 digits) is said by its size."""
    if value.bit_length() > 14_000:  # about 4,214 digits: str() may refuse it
        digits = int(value.bit_length() * 0.30103) + 1
        return f"{'-' if value < 0 else ''}(about {digits:,} digits)"
    return shorten(str(value), limit)


def describe(value: object) -> str:
    """How a TOML value reads in an error message: ``integer 5``, ``a table``; a long
    string or number is shortened, and a missing value (``None``) is ``nothing``."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {int_text(value)}"
    if isinstance(value, float):
        return f"float {value!r}"
    if isinstance(value, str):
        return f"string {shorten(repr(value))}"
    if isinstance(value, dict):
        return "a table" if value else "an empty table"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, datetime.datetime):
        return f"date-time {value.isoformat()}"
    if isinstance(value, datetime.date):
        return f"date {value.isoformat()}"
    if isinstance(value, datetime.time):
        return f"time of day {value.isoformat()}"
    return f"a {type(value).__name__} value"
