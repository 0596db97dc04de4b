"""Every example runs as its docstring says, the way a user runs it, twice in a row.

Each script under ``examples/`` (not ``__init__.py``, not a private helper such as
``_data.py``) runs as ``python examples/path/to/script.py`` in a subprocess, from the root
of a fresh copy of what git tracks in ``examples/`` and ``specs/`` (no ``runs/`` left
from before), with only the installed package importable: the editable install exposes
``schedtrain`` alone, and ``PYTHONPATH`` is dropped. The second run meets what the first
left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.relative_to(ROOT) for p in (ROOT / "examples").rglob("*.py")
                 if p.name != "__init__.py" and not p.name.startswith("_"))
#: The folders of the repository a run of an example may read.
COPIED = ("examples", "specs")


def _tracked(folder: str) -> list[str]:
    """The files git tracks under ``folder`` (every file, outside a git work tree)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", folder], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return [str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts]
    return [name for name in out.split("\0") if name]


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A fresh copy of the repository's examples and specs, as a new clone has them."""
    for folder in COPIED:
        for name in _tracked(folder):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tmp_path / name)
    return tmp_path


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def _said(out: subprocess.CompletedProcess[str]) -> str:
    return f"exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"


def test_the_examples_are_found() -> None:
    """The list below is about something: the seeds and the top-level scripts."""
    names = {p.as_posix() for p in SCRIPTS}
    assert {"examples/custom_trigger.py", "examples/seeds/verify_batch.py",
            "examples/seeds/tensorpack_resnet.py"} <= names
    assert not any(Path(n).name.startswith("_") for n in names)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.as_posix())
def test_example_runs_twice_as_a_script(script: Path, clone: Path) -> None:
    """``python examples/.../NAME.py`` exits 0 from the repository root, and again."""
    assert (clone / script).is_file()
    for attempt in ("first", "second"):
        out = _run([sys.executable, script.as_posix()], clone)
        assert out.returncode == 0, f"python {script.as_posix()}, {attempt} run: {_said(out)}"


@pytest.mark.slow
def test_the_digits_task_trains_from_the_repository_root(clone: Path) -> None:
    """``schedtrain train specs/digits.toml`` finds ``examples.digits:make_task`` from the
    root; run again it is refused (exit 2) naming the two ways out that examples/digits.py
    documents, and ``--overwrite`` runs it again."""
    train = [sys.executable, "-m", "schedtrain", "train", "specs/digits.toml"]
    first = _run(train, clone)
    assert first.returncode == 0, _said(first)
    assert "run directory runs/digits" in first.stdout + first.stderr
    again = _run(train, clone)
    assert again.returncode == 2, _said(again)
    assert "--overwrite" in again.stderr and "--resume auto" in again.stderr
    assert "Traceback" not in again.stderr
    doc = (ROOT / "examples" / "digits.py").read_text()
    assert "--overwrite" in doc and "--resume auto" in doc
    over = _run([*train, "--overwrite"], clone)
    assert over.returncode == 0, _said(over)
