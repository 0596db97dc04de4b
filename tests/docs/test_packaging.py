"""What an install puts on ``sys.path``: the ``schedtrain`` package, nothing else of the
repository (so the documented lookup of a spec's task modules is what a user meets)."""

from __future__ import annotations

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


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, text=True,
                          capture_output=True, check=False)


def test_repository_folders_are_found() -> None:
    """The rule below is about something: examples/, tests/ and benchmarks/ hold code."""
    assert {"examples", "tests", "benchmarks"} <= set(NOT_PACKAGES)


@pytest.mark.parametrize("name", NOT_PACKAGES)
def test_only_the_package_is_importable_elsewhere(name: str, tmp_path: Path) -> None:
    """From a folder outside the repository, ``schedtrain`` imports from this checkout and
    no other top-level folder of the repository does (an editable install exposes the
    package alone, as a wheel would)."""
    got = _python(f"import schedtrain\nprint(schedtrain.__file__)\nimport {name}", tmp_path)
    assert got.stdout.strip() == str(ROOT / "schedtrain" / "__init__.py"), got.stderr
    assert f"ModuleNotFoundError: No module named '{name}'" in got.stderr, got.stderr
