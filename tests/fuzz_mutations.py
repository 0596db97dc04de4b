"""The persisted-state fuzzer's walker and mutations: every leaf of every file a run
directory holds (JSON files, each line of ``events.jsonl``, each checkpoint's ``run``
tree), and what a hostile user or a damaged disk could leave in its place. A mutated
checkpoint is written back with its checksum recomputed, so it loads as valid."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import torch

from schedtrain.checkpoints.format import digest

Key = tuple[str | int, ...]
#: Lists longer than this are walked at their first and last element only (an RNG
#: state's 624 words are one kind of leaf, not 624).
WALK_LIST = 8
DEEP = 100_000
LONG = 10**6
_SENTINEL = "\x00fuzz-deep\x00"

#: Value mutations: what replaces a leaf.
VALUES: dict[str, Callable[[Any], Any]] = {
    "str": lambda v: "fuzz" if not isinstance(v, str) else 1,
    "none": lambda v: None,
    "list": lambda v: [v],
    "table": lambda v: {"fuzz": v},
    "bool": lambda v: not v if isinstance(v, bool) else True,
    "nan": lambda v: math.nan,
    "inf": lambda v: math.inf,
    "-inf": lambda v: -math.inf,
    "1e308": lambda v: 1e308,
    "-1": lambda v: -1,
    "0": lambda v: 0,
    "10**12": lambda v: 10**12,
    "long list": lambda v: [0] * LONG,
    "deep": lambda v: _SENTINEL,  # written as 100,000 nested lists
    "newline": lambda v: "x\nerror: forged second line",
    "ansi": lambda v: "\x1b[31mred\x1b[0m\x1b]0;title\x07",
}
#: Mutations of a table (any node that is a dict): a key missing, a key added.
TABLES = ("missing", "extra")
#: Mutations of the file as a whole.
FILES = ("fifo", "directory", "symlink", "empty", "garbage")
#: Mutations of one line of events.jsonl as a whole.
LINES = ("drop line", "garbage line")
MUTATIONS = (*VALUES, *TABLES, *FILES, *LINES)


@attrs.frozen
class Site:
    """A place to mutate: a file of the run (relative path), the line of a JSON-lines
    file (else None), and the key path inside it (``()``: the document)."""

    file: str
    line: int | None
    key: Key

    def where(self) -> str:
        line = f" line {self.line + 1}" if self.line is not None else ""
        key = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in self.key)
        return f"{self.file}{line}{key}"


@attrs.frozen
class Mutation:
    site: Site
    kind: str

    def __str__(self) -> str:
        return f"{self.site.where()} <- {self.kind}"


def files(run_dir: Path) -> list[str]:
    """Every persisted file of the run, relative to it (the lock file aside)."""
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
                  if p.is_file() and p.name != ".lock" and not p.name.endswith(".tmp"))


def _documents(run_dir: Path, name: str) -> Iterator[tuple[int | None, Any]]:
    path = run_dir / name
    if name.endswith(".pt"):
        yield None, torch.load(path, weights_only=True)
    elif name.endswith(".jsonl"):
        for i, line in enumerate(path.read_text().splitlines()):
            yield i, json.loads(line)
    elif name.endswith(".json"):
        yield None, json.loads(path.read_text())


def _walk(value: Any, key: Key) -> Iterator[tuple[Key, Any]]:
    yield key, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, (*key, k))
    elif isinstance(value, (list, tuple)):
        picks = range(len(value)) if len(value) <= WALK_LIST else (0, len(value) - 1)
        for i in picks:
            yield from _walk(value[i], (*key, i))


def mutations(run_dir: Path) -> list[Mutation]:
    """Every mutation of every leaf, table, line and file of the run (a checkpoint's
    ``run`` tree only: its weights are the model's, not state read back)."""
    out = []
    for name in files(run_dir):
        out += [Mutation(Site(name, None, ()), kind) for kind in FILES]
        for line, doc in _documents(run_dir, name):
            if line is not None:
                out += [Mutation(Site(name, line, ()), kind) for kind in LINES]
            root: Key = ("run",) if name.endswith(".pt") else ()
            start = doc["run"] if name.endswith(".pt") else doc
            for key, value in _walk(start, root):
                if isinstance(value, dict):
                    out += [Mutation(Site(name, line, key), kind) for kind in TABLES
                            if key or kind == "extra"]
                else:
                    out += [Mutation(Site(name, line, key), kind) for kind in VALUES]
    return out


def _replace(doc: Any, key: Key, kind: str) -> Any:
    """``doc`` with the node at ``key`` mutated (in place where it is nested)."""
    if not key:
        return {**doc, "fuzz_extra": 1} if kind == "extra" else VALUES[kind](doc)
    parent = doc
    for k in key[:-1]:
        parent = parent[k]
    last = key[-1]
    if kind == "missing":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    elif kind == "extra":
        parent[last] = {**parent[last], "fuzz_extra": 1}
    else:
        if isinstance(parent, tuple):  # rebuilt as a list: torch.load gives tuples back
            raise TypeError("a tuple")
        parent[last] = VALUES[kind](parent[last])
    return doc


def _deep_json(text: str) -> str:
    return text.replace(json.dumps(_SENTINEL), "[" * DEEP + "]" * DEEP)


def _deep_list() -> list[Any]:
    value: list[Any] = []
    for _ in range(DEEP):
        value = [value]
    return value


def _big_stack(fn: Callable[[], None]) -> None:
    """``fn`` in a thread with room to recurse 100,000 levels (pickling deep lists)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            failed.append(exc)

    old, limit = threading.stack_size(), sys.getrecursionlimit()
    threading.stack_size(1 << 30)
    sys.setrecursionlimit(10 * DEEP)
    try:
        t = threading.Thread(target=run)
        t.start()
        t.join()
    finally:
        threading.stack_size(old)
        sys.setrecursionlimit(limit)
    if failed:
        raise failed[0]


def apply(mutation: Mutation, run_dir: Path, elsewhere: Path) -> None:
    """Write ``mutation`` into ``run_dir`` (a symlink points at a copy in ``elsewhere``,
    outside the run). Raises where the value cannot be written in that file's format."""
    site, kind = mutation.site, mutation.kind
    path = run_dir / site.file
    if kind in FILES:
        data = path.read_bytes()
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "directory":
            path.mkdir()
        elif kind == "symlink":
            elsewhere.mkdir(parents=True, exist_ok=True)
            target = elsewhere / path.name
            target.write_bytes(data)
            path.symlink_to(target)
        else:
            path.write_bytes(b"" if kind == "empty" else b"\x00\xff{not schedtrain's")
        return
    if site.file.endswith(".pt"):
        state = torch.load(path, weights_only=True)
        state = _replace(state, site.key, kind)
        if kind == "deep":
            parent = state
            for k in site.key[:-1]:
                parent = parent[k]
            parent[site.key[-1]] = _deep_list()
        state = {k: v for k, v in state.items() if k != "checksum"}

        def save() -> None:
            state["checksum"] = {"algorithm": "blake2b-256", "digest": digest(state)}
            torch.save(state, path)

        _big_stack(save) if kind == "deep" else save()
        return
    if site.line is None:
        text = _dump(_replace(json.loads(path.read_text()), site.key, kind))
    else:
        lines = path.read_text().splitlines()
        if kind == "drop line":
            del lines[site.line]
        elif kind == "garbage line":
            lines[site.line] = '{"kind": "firing", "step": '
        else:
            lines[site.line] = _dump(_replace(json.loads(lines[site.line]), site.key, kind))
        text = "".join(f"{x}\n" for x in lines)
    path.write_text(text)


def _dump(value: Any) -> str:
    text = json.dumps(value)  # NaN and Infinity written as Python does, as a user might
    return _deep_json(text) if _SENTINEL[1:-1] in text else text


@attrs.frozen
class Part:
    """A part of a fuzz test's cases, so pytest-xdist can spread them over its workers:
    ``cases`` drawn from the files of kind ``kind`` (the test's ``kind_of`` says a file's)
    of fixture ``fixture``, every ``of``-th from the ``at``-th in name order (checkpoint
    steps may follow the wall clock: parts by position, not by name)."""

    kind: str
    cases: int
    at: int = 0
    of: int = 1
    fixture: str = ""

    @property
    def id(self) -> str:
        share = f"{self.at + 1}of{self.of}" if self.of > 1 else ""
        return "-".join(x for x in (self.fixture, self.kind, share) if x)

    def pick(self, files: Iterable[str],
             kind_of: Callable[[str], str]) -> list[str]:
        """This part's files among a fixture's."""
        return sorted(f for f in files if kind_of(f) == self.kind)[self.at::self.of]
