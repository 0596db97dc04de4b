"""Run many lifecycles of the run's-life state machine (tests/life_machine.py, issue
42) and print the counts: lifecycles, operations by kind, invariant checks, and each
kind of failure found with its minimal sequence. A failure of a new kind is shrunk,
printed and then tolerated (counted), so the run goes on past it.

    python benchmarks/run_life.py [--lifecycles 300] [--minutes M] [--chunk 20] [--steps 8]
                                  [--no-shrink] [--strict]

Reproduce a printed failure: the sequence is hypothesis' falsifying example; paste its
steps into a test (tests/lifecycle/test_run_life.py shows how to drive the machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import life_checks as checks
import life_machine as machine
from hypothesis import HealthCheck, Phase, settings
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import run_state_machine_as_test
from life_faults import warm_up
from life_runfiles import s3_bucket
from notice_server import NoticeServer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lifecycles", type=int, default=300)
    p.add_argument("--minutes", type=float, default=0.0,
                   help="start no chunk of lifecycles after this many minutes (0: no limit)")
    p.add_argument("--chunk", type=int, default=20, help="lifecycles a hypothesis run")
    p.add_argument("--steps", type=int, default=8, help="operations a lifecycle, at most")
    p.add_argument("--no-shrink", action="store_true", help="print failures unshrunk")
    p.add_argument("--shrink-seconds", type=int, default=90,
                   help="shrink a failure this long at most (hypothesis' own cap is 300 s)")
    p.add_argument("--strict", action="store_true",
                   help="tolerate no known defect (none is known: kept for scripts)")
    args = p.parse_args()
    # Each shrink step reruns real runs: capped, the partly shrunk sequence is printed.
    engine.MAX_SHRINKING_SECONDS = args.shrink_seconds
    warm_up()
    start = time.monotonic()
    until = start + 60 * args.minutes if args.minutes else float("inf")
    found: list[tuple[str, str]] = []
    phases = [Phase.generate] if args.no_shrink else [Phase.generate, Phase.shrink]
    with NoticeServer() as server, s3_bucket() as bucket:
        machine.NOTICE.update(server=server, port=server.port, s3=bucket)
        while machine.COUNTS["lifecycles"] < args.lifecycles and time.monotonic() < until:
            # Each chunk draws afresh (not derandomized): a failure is reproduced from
            # its printed sequence.
            chunk = min(args.chunk, args.lifecycles - machine.COUNTS["lifecycles"])
            try:
                run_state_machine_as_test(machine.RunLife, settings=settings(  # type: ignore[no-untyped-call]
                    max_examples=chunk, stateful_step_count=args.steps, deadline=None,
                    database=None, phases=phases, report_multiple_bugs=False,
                    suppress_health_check=list(HealthCheck)))
            except Exception as exc:  # a harness error too: printed, and the run goes on
                kind = exc.kind if isinstance(exc, machine.LifeFailure) else type(exc).__name__
                notes = "\n".join(getattr(exc, "__notes__", []))
                found.append((kind, f"{exc}\n{notes}"))
                print(f"found [{kind}] after {machine.COUNTS['lifecycles']} lifecycles, "
                      f"{time.monotonic() - start:.0f} s\n{exc}\n{notes}", flush=True)
                machine.TOLERATED.add(kind)
    elapsed = time.monotonic() - start
    print(f"\n{machine.COUNTS['lifecycles']} lifecycles (shrinking included), "
          f"{machine.COUNTS['operations']} operations, "
          f"{machine.COUNTS['invariant checks']} invariant checks in {elapsed:.0f} s")
    for key, n in sorted(machine.COUNTS.items()):
        print(f"  {key:40} {n}")
    for kind, text in found:
        print(f"\n=== failure [{kind}] (minimal sequence) ===\n{text}")
    for kind, text in sorted(checks.SEEN.items()):
        print(f"\n=== seen [{kind}] (its shortest lifecycle) ===\n{text}")
    print("reproduce: each failure's sequence above (hypothesis' falsifying example)")


if __name__ == "__main__":
    main()
