"""The README's editable install leaves a user's pytest runs quiet.

pytest marks for assertion rewriting the top-level modules listed by a distribution with
a ``pytest11`` entry point (schedtrain's schedule-coverage plugin); a module among them
that a ``.pth`` file imports at interpreter start cannot be rewritten, and pytest warns
in every run (an error under ``-W error``). hatch_build.py names the editable install's
import hook so that pytest skips it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from _pytest.config import _iter_rewritable_modules

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def editable_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The editable wheel ``pip install -e .`` builds from this checkout."""
    builder = pytest.importorskip("hatchling.builders.wheel").WheelBuilder(str(ROOT))
    (wheel,) = builder.build(directory=str(tmp_path_factory.mktemp("wheel")),
                             versions=["editable"])
    return Path(wheel)


def test_no_module_imported_at_start_is_marked_for_rewrite(editable_wheel: Path) -> None:
    """What the wheel's ``.pth`` files import is not what pytest would mark; the RECORD
    lists every file with its hash."""
    with zipfile.ZipFile(editable_wheel) as z:
        names = z.namelist()
        imported = {line.split()[1] for n in names if n.endswith(".pth")
                    for line in z.read(n).decode().splitlines() if line.startswith("import ")}
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        listed = [line.split(",")[0] for line in z.read(record).decode().splitlines()]
    assert imported, "the editable wheel imports its hook from a .pth"
    assert sorted(listed) == sorted(names)
    marked = set(_iter_rewritable_modules(listed))
    assert not marked & imported, f"pytest would warn about {marked & imported}"


def test_a_users_pytest_run_shows_no_rewrite_warning(editable_wheel: Path,
                                                     tmp_path: Path) -> None:
    """A user's project (a folder of its own, outside this repository's pyproject) with
    the editable install: its pytest run, warnings as errors, passes with no warning."""
    site = tmp_path / "site"
    with zipfile.ZipFile(editable_wheel) as z:
        z.extractall(site)
    # what pip adds on install, and pytest reads to tell an editable install
    (next(site.glob("*.dist-info")) / "direct_url.json").write_text(json.dumps(
        {"url": ROOT.as_uri(), "dir_info": {"editable": True}}))
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_user.py").write_text(
        "import schedtrain\n\ndef test_it():\n    assert schedtrain.every('2 steps')\n")
    # No site processing (-S): this checkout's own install stays out; the wheel's .pth is
    # processed as site-packages would process it.
    paths = [p for p in sys.path if p]
    code = ("import site, sys\n"
            f"sys.path[1:1] = {paths!r}\n"
            f"site.addsitedir({str(site)!r})\n"
            "import pytest\n"
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:randomly', "
            "'-W', 'error', 'test_user.py']))\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=project, text=True,
                         capture_output=True, timeout=300, check=False)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    assert "1 passed" in said and "warning" not in said.lower(), said
