"""What an install puts on ``sys.path``: the ``schedtrain`` package, nothing else of the
repository (so the documented lookup of a spec's task modules is what a user meets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Top-level folders of the repository holding Python files that are not the package.
NOT_PACKAGES = sorted(p.name for p in ROOT.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and p.name != "schedtrain"
                      and any(p.rglob("*.py")))


def test_repository_folders_are_found() -> None:
    """The rule below is about something: examples/, tests/ and benchmarks/ hold code."""
    assert {"examples", "tests", "benchmarks"} <= set(NOT_PACKAGES)


#: One fresh interpreter, outside the repository, imports ``schedtrain`` then tries each
#: folder's name in turn (a failed import leaves nothing behind), saying each one's error.
PROBE = """
import json, sys
import schedtrain
said = {"schedtrain": schedtrain.__file__}
for name in sys.argv[1:]:
    try:
        __import__(name)
        said[name] = "imported"
    except ImportError as exc:
        said[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(said))
"""


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``schedtrain``'s file, and what importing each folder's name said."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    got = subprocess.run([sys.executable, "-c", PROBE, *NOT_PACKAGES],
                         cwd=tmp_path_factory.mktemp("elsewhere"), env=env, text=True,
                         capture_output=True, check=False)
    assert got.returncode == 0, got.stderr
    said: dict[str, str] = json.loads(got.stdout.splitlines()[-1])
    return said


@pytest.mark.parametrize("name", NOT_PACKAGES)
def test_only_the_package_is_importable_elsewhere(name: str, imported: dict[str, str]) -> None:
    """From a folder outside the repository, ``schedtrain`` imports from this checkout and
    no other top-level folder of the repository does (an editable install exposes the
    package alone, as a wheel would)."""
    assert imported["schedtrain"] == str(ROOT / "schedtrain" / "__init__.py")
    assert imported[name] == f"ModuleNotFoundError: No module named '{name}'"
