"""How many random killed-and-resumed host runs agree with ``simulate()``, as a table.

Each case draws a schedule, a run shape (epochs, micro-batches per epoch, accumulation,
an uneven last batch) and a kill point, kills the host's run there as a crash would,
resumes it the host's own way from its newest checkpoint, and compares every firing and
the host step each action saw with ``simulate()`` (tests/integrations/host_agreement.py;
the property tests in tests/integrations/test_host_agreement_table.py run a few of the
same cases).

    python benchmarks/host_agreement.py --cases 40                  # every host, 40 each
    python benchmarks/host_agreement.py --cases 30 ignite=100 --seed 1

Columns: distinct schedules, shapes and kill points ((shape, micro-batch) pairs) drawn;
"afresh": cases killed before the first checkpoint (rerun from the start); the firings and
actions compared over all cases. A disagreement is printed with its case, and the exit
status is 1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "integrations")]  # the helpers and the hosts' tests

from host_agreement import HOSTS, Case, cases, check  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402


@dataclass
class Tally:
    cases: int = 0
    schedules: set[str] = field(default_factory=set)
    shapes: set[object] = field(default_factory=set)
    kills: set[object] = field(default_factory=set)
    firings: int = 0
    actions: int = 0
    fresh: int = 0  # killed before the first checkpoint: started afresh
    failed: list[tuple[Case, str]] = field(default_factory=list)
    seconds: float = 0.0


def run(host: str, n: int, rng_seed: int) -> Tally:
    tally = Tally()

    @seed(rng_seed)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=cases(host))
    def one(case: Case) -> None:
        tally.cases += 1
        tally.schedules.add(repr(case.schedule))
        tally.shapes.add(case.shape)
        tally.kills.add((case.shape, case.kill))
        # the hosts' own printing (HF's metrics and shard bars) kept out of the table
        with (tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()),
              contextlib.redirect_stderr(io.StringIO())):
            try:
                got = check(case, Path(folder))
            except AssertionError as exc:  # a real disagreement: keep going, report it
                tally.failed.append((case, str(exc).splitlines()[0]))
                return
        tally.firings += got.firings
        tally.actions += got.actions
        tally.fresh += got.resumed_from is None

    start = time.perf_counter()
    one()
    tally.seconds = time.perf_counter() - start
    return tally


def parse_cases(values: list[str]) -> dict[str, int]:
    """``N`` for every host, ``host=N`` for one."""
    out: dict[str, int] = {}
    for v in values:
        name, _, count = v.rpartition("=")
        for h in ([name] if name else HOSTS):
            if h not in HOSTS:
                raise SystemExit(f"--cases {v}: unknown host {h!r}; expected one of {HOSTS}")
            out[h] = int(count)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["20"], metavar="N|HOST=N",
                        help="random cases per host (default 20)")
    parser.add_argument("--hosts", nargs="+", choices=HOSTS, default=list(HOSTS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    counts = parse_cases(args.cases)
    warnings.simplefilter("ignore")
    rows = []
    for host in args.hosts:
        tally = run(host, counts.get(host, 20), args.seed)
        rows.append((host, tally))
        print(f"{host}: {tally.cases} cases in {tally.seconds:.0f} s", file=sys.stderr)
    head = ("host", "cases", "schedules", "shapes", "kill points", "afresh",
            "firings compared", "actions compared", "all equal", "seconds")
    table = [head] + [(h, str(t.cases), str(len(t.schedules)), str(len(t.shapes)),
                       str(len(t.kills)), str(t.fresh), str(t.firings), str(t.actions),
                       "no" if t.failed else "yes", f"{t.seconds:.0f}") for h, t in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for i, r in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print("\nreproduce: python benchmarks/host_agreement.py "
          + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])))
    for host, tally in rows:
        for case, why in tally.failed:
            print(f"\nDISAGREES ({host}): {why}\n  {case!r}")
    return 1 if any(t.failed for _, t in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
