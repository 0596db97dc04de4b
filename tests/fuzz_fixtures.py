"""The persisted-state fuzzer's fixture runs, by name, each with its intact resume (the
reference every mutated case must reproduce) and every mutation of its run directory:
``auto`` (tests/fuzz_runs.py: an ``every = "auto"`` saver, a retime journal, a SIGTERM
preemption on one process) and ``notice`` (tests/fuzz_notice.py: an applied live
retime, a division from one process to two, a cloud notice preemption)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
from fuzz_mutations import Mutation, mutations
from fuzz_notice import notice_fixture
from fuzz_runs import Reference, make_fixture, reference, warm_up

#: The fixtures' names, in the order they are made.
FIXTURES = ("auto", "notice")


@attrs.frozen
class FuzzRun:
    """A fixture run, its intact resume and every mutation of it (shown short: a
    failure names the mutation, not the reference log)."""

    name: str
    fixture: Path
    ref: Reference = attrs.field(repr=False)
    every: list[Mutation] = attrs.field(repr=False)


class FuzzRuns:
    """The fixture runs made under ``root`` as they are first asked for, each once, held
    until ``stack`` closes (the notice fixture's server port stays refused while its
    cases run): a part of the fuzzer that needs one fixture does not wait for the other."""

    def __init__(self, root: Path, stack: contextlib.ExitStack) -> None:
        self.root = root
        self._stack = stack
        self._made: dict[str, FuzzRun] = {}

    def __getitem__(self, name: str) -> FuzzRun:
        if name not in FIXTURES:
            raise ValueError(f"no fixture named {name!r}; the fixtures: {FIXTURES}")
        if name not in self._made:
            warm_up()
            folder = self.root / name
            if name == "auto":
                fixture = make_fixture(folder / "fixture")
            else:
                fixture = self._stack.enter_context(notice_fixture(folder / "fixture"))
            self._made[name] = FuzzRun(name, fixture,
                                       reference(fixture, folder / "reference"),
                                       mutations(fixture / "run"))
        return self._made[name]


@contextlib.contextmanager
def lazy_runs(root: Path) -> Iterator[FuzzRuns]:
    """:class:`FuzzRuns` under ``root``, its fixtures held until the context ends."""
    with contextlib.ExitStack() as stack:
        yield FuzzRuns(root, stack)


@contextlib.contextmanager
def fuzz_runs(root: Path, names: Sequence[str] = FIXTURES) -> Iterator[dict[str, FuzzRun]]:
    """The named fixtures made under ``root`` (each once), held until the context ends."""
    unknown = set(names) - set(FIXTURES)
    if unknown:
        raise ValueError(f"no fixture named {sorted(unknown)}; the fixtures: {FIXTURES}")
    with lazy_runs(root) as runs:
        yield {name: runs[name] for name in names}
