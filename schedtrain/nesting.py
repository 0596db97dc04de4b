"""How deeply a JSON text nests, found by one linear scan (strings skipped): a file read
back is refused before Python's own reader recurses through 100,000 levels, and the key
path where it nests too deep is named."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

import attrs

__all__ = ["CONTROL", "MAX_DEPTH", "PLAIN", "check_depth", "check_plain", "printable",
           "too_deep_at"]

#: How deeply lists and tables of a read-back JSON file may nest (schedtrain writes at
#: most a few levels; Python's own reader would overflow its stack near 1,000).
MAX_DEPTH: Final = 32

#: Control characters: a newline would forge a second message line, an escape a colour.
CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters (a newline that would forge a second message
    line, a terminal escape) written as ``\\xNN``."""
    return CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def check_depth(text: str | bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON ``text`` nests lists and tables at most ``limit`` deep (strings
    skipped): a linear scan, so a 100,000-deep file is refused before ``json`` recurses."""
    return too_deep_at(text, limit) is None


def too_deep_at(text: str | bytes, limit: int = MAX_DEPTH) -> str | None:
    """The key path where JSON ``text`` first nests deeper than ``limit`` (``""``: at its
    top), or ``None`` where it does not; one linear scan, strings skipped."""
    data = text.encode() if isinstance(text, str) else text
    # Per open container: its key path, whether a table, its item index, its key now.
    frames: list[_Frame] = []
    last = ""
    in_string = escaped = False
    start = 0
    for i, byte in enumerate(data):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
                last = data[start:i].decode("utf-8", "replace")
            continue
        if byte == 0x22:
            in_string, start = True, i + 1
        elif byte in (0x5B, 0x7B):  # [ {
            where = frames[-1].child() if frames else ""
            if len(frames) >= limit:  # named by its last key: the run of [0]s says nothing
                named = max((f for f in frames if f.table), default=None,
                            key=lambda f: len(f.path))
                return "" if named is None else named.child()
            frames.append(_Frame(where, byte == 0x7B))
        elif byte in (0x5D, 0x7D):  # ] }
            if frames:
                frames.pop()
        elif byte == 0x2C and frames:  # , : the next item
            frames[-1].index += 1
        elif byte == 0x3A and frames:  # : the string before it is a key
            frames[-1].key = printable(last)[:60]
    return None


@attrs.define
class _Frame:
    """A container open in ``too_deep_at``'s scan."""

    path: str
    table: bool
    index: int = 0
    key: str = ""

    def child(self) -> str:
        if self.table:
            return f"{self.path}.{self.key}" if self.path else self.key
        return f"{self.path}[{self.index}]"


#: What a checkpoint holds besides tensors: what ``torch.load(weights_only=True)`` reads.
PLAIN: Final[tuple[type, ...]] = (type(None), bool, int, float, complex, str, bytes)


def check_plain(value: Any, where: str, *, plain: tuple[type, ...] = PLAIN,
                error: Callable[[str], Exception] = TypeError,
                holds: str = "a checkpoint holds numbers, strings, lists and dicts of them",
                ) -> None:
    """Refuse a value inside ``value`` that is none of ``plain`` nor a dict, list, tuple or
    set of them, raising ``error(message)`` at its key path under ``where`` (what the
    container ``holds`` is said after it)."""
    if isinstance(value, plain):
        return
    if isinstance(value, dict):  # OrderedDict included
        for k, v in value.items():
            check_plain(k, where, plain=plain, error=error, holds=holds)
            check_plain(v, f"{where}.{k}", plain=plain, error=error, holds=holds)
        return
    if isinstance(value, list | tuple | set):
        for i, v in enumerate(value):
            check_plain(v, f"{where}[{i}]", plain=plain, error=error, holds=holds)
        return
    raise error(f"{where}: {type(value).__name__} {value!r:.60} is not plain data; {holds}")
