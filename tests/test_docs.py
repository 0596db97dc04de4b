"""Every Python block in the README and docs runs as written.

A file's blocks run in order in one namespace (a later block may use an earlier one's
names), in a scratch directory; the ``test_*`` functions a block defines run right after
it. Blocks fenced as ``pycon`` (an interactive session) or ``text`` are not run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each block runs, and every test function in it passes."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    namespace: dict[str, object] = {"__name__": f"docs_{Path(page).stem}"}
    for i, block in enumerate(_blocks(ROOT / page)):
        before = set(namespace)
        try:
            exec(compile(block, f"{page} (block {i + 1})", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{page}, Python block {i + 1} fails: {exc!r}") from exc
        for name in sorted(set(namespace) - before):
            test = namespace[name]
            if name.startswith("test_") and callable(test):
                test()


def test_pages_have_blocks() -> None:
    """The pages that teach the API show code (so the test above covers something)."""
    for page in ("README.md", "docs/testing.md", "docs/triggers.md", "docs/toml.md"):
        assert _blocks(ROOT / page), page


def test_builtins_importable_from_callbacks() -> None:
    """Every built-in callback type of the registry is exported by ``schedtrain.callbacks``
    (the docs import them from there) and is the class TOML resolves."""
    import schedtrain.callbacks
    from schedtrain.spec.registry import BUILTINS, resolve

    for name in BUILTINS:
        assert name in schedtrain.callbacks.__all__, name
        assert getattr(schedtrain.callbacks, name) is resolve(name)


def _outside_code(path: Path) -> list[str]:
    """The page's lines, fenced code blocks blanked out."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


@pytest.mark.parametrize("page", PAGES)
def test_tables_are_whole(page: str) -> None:
    """Every Markdown table has its header and separator: rows after a blank line would
    start a second table with no header (rendered as text)."""
    block: list[str] = []
    for line in [*_outside_code(ROOT / page), ""]:
        if line.lstrip().startswith("|"):
            block.append(line)
            continue
        if block:
            assert len(block) >= 2 and re.fullmatch(r"\s*\|[\s:|-]*-[\s:|-]*", block[1]), (
                f"{page}: a table without a header row and separator starts with {block[0]!r}")
        block = []


def test_readme_links_every_page() -> None:
    """The README links every page of docs/, and says how to run several processes."""
    readme = (ROOT / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f"](docs/{page.name})" in readme, page.name
    assert "torchrun" in readme
