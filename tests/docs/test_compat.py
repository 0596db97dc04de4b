"""Moved import paths keep working for one minor version, with a warning naming the new one."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings

import pytest

from schedtrain.compat import MOVED, REMOVED_IN

#: Each path's check, run in a process where nothing of schedtrain was imported before.
CHECK = """import warnings, sys; warnings.simplefilter('error')
import {new} as new
warnings.simplefilter('always')
with warnings.catch_warnings(record=True) as got:
    import {old} as old
assert old is new, (old, new)
assert len(got) == 1 and got[0].category is DeprecationWarning, got
print(got[0].message, '|', got[0].filename)
"""
#: One fresh interpreter imports the third-party libraries the paths import (torch and
#: structlog: seconds on a loaded machine) once, then forks a child per path that runs
#: its CHECK as ``-c`` would (its file "<string>"); it prints each child's exit code,
#: stdout and stderr.
PROBE = """
import json, os, sys, tempfile, traceback
import structlog, torch

said = {}
for old, check in json.loads(sys.argv[1]).items():
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = os.fdopen(1, "w", buffering=1)
                sys.stderr = os.fdopen(2, "w", buffering=1)
                exec(compile(check, "<string>", "exec"), {"__name__": "__main__"})
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        said[old] = [os.waitstatus_to_exitcode(status), out.read().decode(),
                     err.read().decode()]
print(json.dumps(said))
"""


@pytest.fixture(scope="module")
def imported() -> dict[str, tuple[int, str, str]]:
    """For each old path: its child's exit code, stdout and stderr (PROBE, run once)."""
    checks = {old: CHECK.format(old=old, new=new) for old, new in MOVED.items()}
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(checks)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    said: dict[str, tuple[int, str, str]] = json.loads(out.stdout.splitlines()[-1])
    return said


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_old_path_is_the_new_module_and_warns(
        old: str, new: str, imported: dict[str, tuple[int, str, str]]) -> None:
    """Importing an old path gives the very module of the new one (classes are identical
    under both names) and a DeprecationWarning that names the new path and the release
    that drops the old one."""
    code, stdout, stderr = imported[old]
    assert code == 0, stderr
    message, _, filename = stdout.strip().partition(" | ")
    assert f"{old} moved to {new}" in message and REMOVED_IN in message
    assert filename == "<string>"  # the warning points at the importing code


def test_from_import_of_an_old_name_warns_once() -> None:
    """``from old.path import Name`` works and warns (the CHANGELOG lists every path)."""
    sys.modules.pop("schedtrain.simclock", None)
    with pytest.warns(DeprecationWarning, match="schedtrain.simulation.simclock"):
        module = importlib.import_module("schedtrain.simclock")
    from schedtrain.simulation import SimClock

    assert module.SimClock is SimClock


def test_changelog_lists_every_moved_path() -> None:
    """Users find each moved path, and its new place, in CHANGELOG.md."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "CHANGELOG.md").read_text()
    missing = [old for old, new in MOVED.items() if f"`{old}`" not in text
               or f"`{new}`" not in text]
    assert missing == []


def test_unknown_paths_are_not_answered() -> None:
    """The finder answers only for listed paths: a misspelt module still fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("schedtrain.no_such_module")


def test_table_fire_is_decide_with_a_warning() -> None:
    """The table decides (``decide``); its old name ``fire`` still answers the same, with a
    DeprecationWarning naming the new one."""
    from schedtrain import Schedule, every
    from schedtrain.clock import LoopClock

    schedule = Schedule({"a": every("2 steps"), "b": every("3 steps")})
    old, new = schedule.compile(), schedule.compile()
    old_clock, new_clock = LoopClock(), LoopClock()
    old.attach(old_clock)
    new.attach(new_clock)
    for _ in range(12):
        for clock in (old_clock, new_clock):
            clock.end_batch()
            clock.end_step()
        with pytest.warns(DeprecationWarning, match="decide"):
            fired = old.fire("step_end")
        assert fired == new.decide("step_end")
