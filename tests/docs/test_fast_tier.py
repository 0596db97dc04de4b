"""The fast tier CONTRIBUTING.md gives for the edit loop is the command that runs: the
``slow`` marker it leaves out is registered (``--strict-markers`` refuses a typo), and
the command, run as written, collects the quick tests and none of those it says it
leaves out."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import conftest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## The fast tier"


def _section() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert SECTION in text
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def _command() -> list[str]:
    """The one command of the section's one ``bash`` block."""
    (block,) = re.findall(r"```bash\n(.*?)```", _section(), re.S)
    (line,) = block.strip().splitlines()
    return shlex.split(line)


def test_the_slow_marker_is_registered_and_markers_are_strict() -> None:
    pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    options = pytest_ini["ini_options"]
    assert "slow" in [m.split(":", 1)[0].strip() for m in options["markers"]]
    assert "--strict-markers" in options["addopts"].split()


def test_the_fast_tier_leaves_out_what_contributing_says() -> None:
    """The command, with ``--collect-only`` and a few paths added: a slow-marked file and
    the folders marked slow as a whole are left out, a quick file is kept; the section
    names each of those folders."""
    command = _command()
    assert command[:3] == ["python", "-m", "pytest"]
    assert command[command.index("-m", 3) + 1] == "not slow"
    for folder in conftest.SLOW_FOLDERS:
        assert f"`tests/{folder}/`" in _section()
    paths = [*(f"tests/{f}" for f in conftest.SLOW_FOLDERS), "tests/training/test_crash.py",
             "tests/core/test_time.py"]
    quiet = [] if "-q" in command else ["-q"]  # one test id a line
    out = subprocess.run([sys.executable, *command[1:], *quiet, "--collect-only",
                          "-p", "no:cacheprovider", *paths], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    collected = [x for x in out.stdout.splitlines() if "::" in x]
    assert collected
    assert {x.split("::", 1)[0] for x in collected} == {"tests/core/test_time.py"}


def test_every_file_listed_as_slow_exists() -> None:
    """conftest.SLOW_FILES names test files that exist (a renamed one would silently join
    the fast tier)."""
    for path in conftest.SLOW_FILES:
        assert (ROOT / "tests" / path).is_file(), path


def test_every_test_listed_as_slow_exists() -> None:
    """conftest.SLOW_TESTS names tests that exist (a renamed test would silently join
    the fast tier): its file, and each class and function of its name in that file."""
    for path, entries in conftest.SLOW_TESTS.items():
        source = (ROOT / "tests" / path).read_text()
        for entry in entries:
            for name in entry.split("[", 1)[0].split("::"):
                assert re.search(rf"^\s*(?:class|def) {re.escape(name)}\b", source, re.M), (
                    path, entry)
