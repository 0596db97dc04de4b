"""Every Python block in the README and docs runs as written.

Each block runs alone, as a reader who copies it would run it: in a fresh namespace and
a fresh scratch directory. A block that goes on from the one before (using its names or
files) says so with an HTML comment line just before its fence, which Markdown does not
render::

    <!-- continue -->
    ```python
    ...
    ```

It then runs in the namespace and directory of the block before it. The ``test_*``
functions a block defines run right after it. Blocks fenced otherwise (``pycon``, an
interactive session; ``text``, ``toml``, ``bash``) are not run. A page also holds no git
merge-conflict marker.
CONTRIBUTING.md says the same for contributors.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_merge_leftovers import conflict_lines

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "CONTRIBUTING.md",
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
#: The line that makes the next Python block go on from the one before it.
CONTINUE = "<!-- continue -->"


@dataclass(frozen=True)
class Block:
    """One Python block of a page: its code, the line of its fence and whether it goes on
    from the block before it."""

    code: str
    line: int
    continues: bool


def _blocks_of(text: str, page: str) -> list[Block]:
    """The page's Python blocks; a ``CONTINUE`` line anywhere but just before a Python
    fence (blank lines between allowed), or before the first, is an error."""
    blocks: list[Block] = []
    lines = text.splitlines()
    fence = ""  # the backticks of the open fence, if any
    start = 0  # the line of the open fence, when it opens a Python block
    marked = 0  # the line of a CONTINUE waiting for its fence
    for n, line in enumerate(lines, 1):
        if fence:
            if line.strip() and set(line.strip()) == {"`"} and len(line.strip()) >= len(fence):
                if start:
                    blocks.append(Block("\n".join(lines[start:n - 1]) + "\n", start,
                                        bool(marked)))
                    marked = 0
                fence, start = "", 0
            continue
        opening = re.match(r"(`{3,})\s*(\S*)", line)
        if line.strip() == CONTINUE:
            marked = n
        elif opening and opening[2] == "python":
            if marked and not blocks:
                raise AssertionError(f"{page}:{marked}: {CONTINUE} before the page's first "
                                     "Python block: there is nothing to continue")
            fence, start = opening[1], n
        elif line.strip() and marked:
            raise AssertionError(f"{page}:{marked}: {CONTINUE} must be the line just "
                                 "before a ```python fence")
        elif opening:
            fence = opening[1]
    if marked:
        raise AssertionError(f"{page}:{marked}: {CONTINUE} must be the line just before a "
                             "```python fence")
    if start:
        raise AssertionError(f"{page}:{start}: a ```python block that never closes")
    return blocks


def _blocks(path: Path) -> list[str]:
    return [block.code for block in _blocks_of(path.read_text(), path.name)]


def check_page(path: Path, page: str, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run every Python block of the page (``page`` names it in errors) as the module
    docstring says, each new chain of blocks in its own folder under ``scratch``; fail,
    naming the page and line, on a block that raises, on a failing ``test_*`` function, or
    on a conflict marker. Returns the number of blocks run."""
    text = path.read_text()
    markers = conflict_lines(text)
    assert not markers, f"{page}: git merge-conflict markers at lines {markers}"
    namespace: dict[str, object] = {}
    blocks = _blocks_of(text, page)
    for i, block in enumerate(blocks, 1):
        if not block.continues:
            namespace = {"__name__": f"docs_{Path(page).stem}_{i}"}
            folder = scratch / f"block-{i}"
            folder.mkdir()
            monkeypatch.chdir(folder)
        where = f"{page}:{block.line} (Python block {i})"
        before = set(namespace)
        try:
            exec(compile(block.code, where, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{where} fails: {exc!r}") from exc
        for name in sorted(set(namespace) - before):
            test = namespace[name]
            if name.startswith("test_") and callable(test):
                try:
                    test()
                except Exception as exc:
                    raise AssertionError(f"{where}: {name}() fails: {exc!r}") from exc
    return len(blocks)


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each block runs, and every test function in it passes."""
    monkeypatch.syspath_prepend(str(ROOT))
    check_page(ROOT / page, page, tmp_path, monkeypatch)


def test_pages_have_blocks() -> None:
    """The pages that teach the API show code (so the test above covers something)."""
    for page in ("README.md", "docs/testing.md", "docs/triggers.md", "docs/toml.md"):
        assert _blocks(ROOT / page), page


def _page(tmp_path: Path, text: str) -> Path:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "page.md"
    path.write_text(text)
    (tmp_path / "scratch").mkdir()
    return path


def _check(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> int:
    return check_page(_page(tmp_path, text), "page.md", tmp_path / "scratch", monkeypatch)


FIRST = ("# Page\n\n```python\nfrom pathlib import Path\n\nvalue = 41\n"
         "Path('f').write_text('x')\n```\n\n")
USES_NAME = "```python\nassert value + 1 == 42\n```\n"
USES_FILE = "```python\nfrom pathlib import Path\n\nassert Path('f').read_text() == 'x'\n```\n"


@pytest.mark.parametrize("second", [USES_NAME, USES_FILE], ids=["name", "file"])
def test_a_block_runs_alone_unless_marked(second: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A block using a name or a file of the block before fails, naming the page and the
    block's line; marked as continuing, it runs."""
    with pytest.raises(AssertionError, match=r"page\.md:10 \(Python block 2\) fails: "
                                             r"(NameError.*'value'|FileNotFoundError)"):
        _check(tmp_path, FIRST + second, monkeypatch)
    assert _check(tmp_path / "x", FIRST + "Then:\n\n<!-- continue -->\n\n" + second,
                  monkeypatch) == 2


def test_a_chain_ends_at_an_unmarked_block(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """After a chain, an unmarked block starts afresh again."""
    text = FIRST + "<!-- continue -->\n" + USES_NAME + "\ntext\n\n" + USES_NAME
    with pytest.raises(AssertionError, match=r"page\.md:17 \(Python block 3\).*'value'"):
        _check(tmp_path, text, monkeypatch)


def test_a_failing_test_function_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``test_*`` function a block defines runs, and its failure names it."""
    text = "```python\ndef test_it():\n    assert 1 == 2\n```\n"
    with pytest.raises(AssertionError, match=r"page\.md:1 \(Python block 1\): test_it\(\)"):
        _check(tmp_path, text, monkeypatch)


def test_other_fences_are_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pycon``, ``toml`` and a longer fence showing Markdown with a Python block inside
    are not run; only the real Python block is."""
    text = ("```pycon\n>>> undefined\n```\n\n```toml\nx = 1\n```\n\n"
            "````markdown\n<!-- continue -->\n```python\nundefined\n```\n````\n\n"
            "```python\nvalue = 1\n```\n")
    assert _check(tmp_path, text, monkeypatch) == 1


@pytest.mark.parametrize(("text", "message"), [
    ("<!-- continue -->\n```python\nx = 1\n```\n", "page.md:1: .* nothing to continue"),
    (FIRST + "<!-- continue -->\ntext\n" + USES_NAME, "page.md:10: .* must be the line just"),
    (FIRST + "<!-- continue -->\n```toml\nx = 1\n```\n", "page.md:10: .* must be the line"),
    (FIRST + "<!-- continue -->\n", "page.md:10: .* must be the line just"),
    ("```python\nx = 1\n", "page.md:1: a ```python block that never closes"),
])
def test_a_misplaced_marker_is_refused(text: str, message: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A continue marker that continues nothing, or is not just before a Python block, is
    an error naming its line (a typo would otherwise go unnoticed)."""
    with pytest.raises(AssertionError, match=message):
        _check(tmp_path, text, monkeypatch)


@settings(max_examples=20)
@given(page=st.sampled_from(PAGES), where=st.floats(0, 1),
       marker=st.sampled_from(["<" * 7 + " HEAD", "=" * 7, ">" * 7 + " branch"]))
def test_a_planted_conflict_marker_fails_any_page(page: str, where: float, marker: str) -> None:
    """A conflict-marker line anywhere in any page fails the page's check before any
    block runs, naming the page and the line."""
    with tempfile.TemporaryDirectory() as folder:
        lines = (ROOT / page).read_text().splitlines()
        at = round(where * len(lines))
        text = "\n".join([*lines[:at], marker, *lines[at:]]) + "\n"
        with pytest.MonkeyPatch.context() as mp, pytest.raises(
                AssertionError, match=rf"{re.escape(page)}: git merge-conflict markers at "
                                      rf"lines \[{at + 1}\]"):
            check_page(_page(Path(folder), text), page, Path(folder, "scratch"), mp)


@pytest.mark.parametrize("page", PAGES)
def test_a_planted_undefined_name_fails_any_page(page: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python block using a name it never defines fails any page, wherever it is planted
    before the page's own blocks (which would otherwise have defined it)."""
    lines = (ROOT / page).read_text().splitlines()
    text = "\n".join(["```python", "assert undefined_name == 1", "```", "", *lines]) + "\n"
    with pytest.raises(AssertionError, match=rf"{re.escape(page)}:1 \(Python block 1\) "
                                             r"fails: NameError"):
        check_page(_page(tmp_path, text), page, tmp_path / "scratch", monkeypatch)


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
