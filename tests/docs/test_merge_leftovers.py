"""No file of the repository holds a git merge-conflict marker.

A conflict resolved by committing the file as git left it keeps ``<<<<<<< ours``,
``=======`` and ``>>>>>>> theirs`` lines: Markdown renders the ``=======`` line as a
heading rule, Python and TOML stop parsing, and nothing else in the suite looks at prose.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
#: The lines git writes around a conflict (``|||||||`` opens the base under diff3).
MARKER = re.compile(r"(<{7}|>{7}|\|{7})( .*)?|={7}")
#: Folders a walk skips when git cannot list the files (an unpacked sdist).
UNLISTED = {".git", ".venv", "runs", "build", "dist", "__pycache__"}


def conflict_lines(text: str) -> list[int]:
    """The 1-based numbers of the lines of ``text`` that are conflict markers."""
    return [n for n, line in enumerate(text.splitlines(), 1)
            if MARKER.fullmatch(line.rstrip())]


def repository_files(root: Path = ROOT) -> list[Path]:
    """The files git tracks (and new ones it does not ignore), or every file of the tree
    outside build and cache folders when ``root`` is not a git work tree."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=root, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for p in sorted(root.rglob("*")) if p.is_file()
                and not UNLISTED.intersection(p.relative_to(root).parts)]
    return [root / name for name in sorted(set(out.decode().split("\0"))) if name]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (a NUL byte, or not UTF-8) or one gone."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None  # deleted in the work tree, or a submodule
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def markers_in(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``file:line: text`` of every conflict marker in the text files among ``paths``."""
    found = []
    for path in paths:
        text = text_of(path)
        for n in conflict_lines(text or ""):
            line = text.splitlines()[n - 1] if text else ""
            found.append(f"{path.relative_to(root)}:{n}: {line}")
    return found


def test_no_conflict_markers_in_the_repository() -> None:
    """Every tracked text file is free of conflict markers."""
    files = repository_files()
    assert len(files) > 50 and ROOT / "README.md" in files  # the listing found the tree
    found = markers_in(files)
    assert not found, "git merge-conflict markers left in:\n" + "\n".join(found)


def test_a_planted_conflict_is_found(tmp_path: Path) -> None:
    """The check finds each kind of marker line, by file and line, in a git work tree and
    in a plain folder; binary files and look-alikes are left alone."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# Title\n\ntext\n" + "<" * 7 + " HEAD\nours\n" + "=" * 7 + "\ntheirs\n"
        + ">" * 7 + " branch\n")
    (tmp_path / "code.py").write_text("x = 1\n" + "|" * 7 + " base\n")
    (tmp_path / "fine.md").write_text("Title\n" + "=" * 8 + "\n\n" + "=" * 30
                                      + " coverage " + "=" * 30 + "\n" + "<" * 7 + "x\n")
    (tmp_path / "blob.bin").write_bytes(b"\0\n" + b"=" * 7 + b"\n")
    want = ["code.py:2: " + "|" * 7 + " base", "docs/page.md:4: " + "<" * 7 + " HEAD",
            "docs/page.md:6: " + "=" * 7, "docs/page.md:8: " + ">" * 7 + " branch"]
    assert markers_in(repository_files(tmp_path), tmp_path) == want
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("ignored/\n")
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "x.md").write_text("=" * 7 + "\n")
    assert markers_in(repository_files(tmp_path), tmp_path) == want


@given(st.lists(st.sampled_from(["<" * 7, "=" * 7, ">" * 7, "|" * 7, "=" * 6, "<" * 8,
                                 " ", "HEAD", "x", "\t"]), max_size=5))
def test_a_marker_is_a_whole_line_of_its_kind(parts: list[str]) -> None:
    """A line is a marker exactly when it is seven ``<``, ``>`` or ``|`` alone or followed
    by a space and a label, or seven ``=`` alone (trailing blanks ignored)."""
    line = "".join(parts)
    body = line.rstrip()
    expected = body == "=" * 7 or (
        body[:7] in ("<" * 7, ">" * 7, "|" * 7) and (len(body) == 7 or body[7] == " "))
    assert (conflict_lines(f"a\n{line}\nb") == [2]) == expected
