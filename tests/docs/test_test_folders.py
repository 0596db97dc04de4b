"""The tests' own shape: one folder per package, helpers importable by name from each.

Test folders have no ``__init__.py`` (pytest's default import mode then imports a test
file by its basename), so a basename used twice would stop collection; the helper
modules at the top of tests/ are imported by bare name from every folder, so none may
share a name with a test file or a folder.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import pytest
from fork_cli import as_fresh_process, leave_child, wait

TESTS = Path(__file__).resolve().parents[1]
#: Folders under tests/ that hold data or jobs, not test files.
NOT_TEST_FOLDERS = {"bad_specs", "jobs", "__pycache__"}


def _folders() -> list[Path]:
    return sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name not in NOT_TEST_FOLDERS)


def test_test_files_live_in_package_folders() -> None:
    """No test file sits at the top of tests/; every folder holds at least two."""
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []
    small = [p.name for p in _folders() if len(list(p.glob("test_*.py"))) < 2]
    assert small == []


def test_basenames_are_unique_and_folders_are_not_packages() -> None:
    """Every test file's basename is unique, no test folder is a package, and no helper
    module shares a name with a test file or a folder."""
    files = sorted(TESTS.rglob("test_*.py"))
    twice = [name for name, n in Counter(p.name for p in files).items() if n > 1]
    assert twice == []
    assert [p for p in _folders() if (p / "__init__.py").exists()] == []
    helpers = {p.stem for p in TESTS.glob("*.py")} - {"conftest"}
    assert helpers & ({p.stem for p in files} | {p.name for p in _folders()}) == set()


def test_test_files_import_test_files_of_their_own_folder() -> None:
    """A test file imports another test file only from its own folder (only its folder
    and tests/ are on sys.path); what several folders share is a helper module."""
    far = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for line in path.read_text().splitlines():
            words = line.split()
            imported = words[1].split(".")[0] if len(words) >= 2 else ""
            if (words and words[0] in ("from", "import") and imported.startswith("test_")
                    and not (path.parent / f"{imported}.py").exists()):
                far.append(f"{path.relative_to(TESTS)}: {line.strip()}")
    assert far == []


def test_helpers_import_by_name_from_every_folder(tmp_path: Path) -> None:
    """A new test file in any folder imports every helper module by its bare name (the
    conftest puts tests/ on sys.path), also under ``--import-mode=importlib``: checked on a
    copy of tests/ without its test files, one probe file in each folder."""
    copy = tmp_path / "tests"
    shutil.copytree(TESTS, copy, ignore=shutil.ignore_patterns("test_*.py", "__pycache__"))
    helpers = sorted(p.stem for p in TESTS.glob("*.py") if p.stem != "conftest")
    body = "".join(f"import {name}\n" for name in helpers) + "\n\ndef test_imports():\n    pass\n"
    for folder in _folders():
        (copy / folder.name / f"test_probe_{folder.name}.py").write_text(body)
    # The default (prepend) mode is what the suite itself runs under.
    code, output = _pytest(["-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                            "--import-mode=importlib", "tests"], cwd=tmp_path)
    assert code == 0, output
    assert f"{len(_folders())} passed" in output, output


def _pytest(args: list[str], cwd: Path) -> tuple[int, str]:
    """``python -m pytest ARGS`` run from ``cwd``, in a forked child of this process that
    looks for modules as that fresh process would (its folder, PYTHONPATH, the
    interpreter's path) and has forgotten every module imported from elsewhere, the
    helpers and conftest among them: each is imported afresh from the copy, while
    torch, lightning and the like, imported here already, are not imported again. Its
    exit code and output."""
    output = cwd / "pytest-output.txt"
    fresh = as_fresh_process([str(cwd), *filter(None, os.environ.get("PYTHONPATH", "").split(
        os.pathsep))])
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(cwd)
            out = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            fresh()
            code = int(pytest.main(args))
        except BaseException:
            traceback.print_exc()
        finally:
            leave_child(code)
    codes = wait([pid], time.monotonic() + 240)
    assert codes is not None, "the inner pytest outlived 240 s"
    return codes[0], output.read_text()
