"""How loading, checking and planning scale with the number of callbacks; start-up cost.

Measures in one run:

* ``load_spec`` (what ``schedtrain check`` does) and ``plan_spec`` on specs of 1,000,
  5,000 and 20,000 callbacks mixing every trigger shape (step periods, epoch periods with
  a condition, ``any`` of a step point and a token point, windows), per callback: flat
  figures mean linear cost;
* the condition parser on texts of 10^3, 10^4 and 10^5 comparisons, per character;
* the start-up of ``import schedtrain``, of the core names, and of ``schedtrain check``
  and ``plan`` on ``specs/digits.toml``, against a bare interpreter.

Reproduce: ``python benchmarks/bench_scaling.py`` (``--quick`` for smaller sizes).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from schedtrain.planning import plan_spec
from schedtrain.spec import load_spec
from schedtrain.triggers import parse_condition

ROOT = Path(__file__).resolve().parent.parent


def write_spec(path: Path, n: int) -> None:
    """``n`` callbacks over 10 epochs of 1,000 steps, four trigger shapes in turn."""
    lines = ["[clock]", "epochs = 10", "steps_per_epoch = 1000", "tokens_per_batch = 10", ""]
    for i in range(n):
        kind = i % 4
        if kind == 0:
            trig = f'{{ every = "{1000 + i % 997} steps" }}'
        elif kind == 1:
            trig = f'{{ every = "{1 + i % 5} epochs", if = "val/loss < {i % 7}" }}'
        elif kind == 2:
            trig = (f'{{ any = [{{ at = "{1 + i % 9973} steps" }}, '
                    f'{{ at = "{30_000 + i} tokens" }}] }}')
        else:
            trig = f'{{ every = "{1 + i % 3} epochs", start = "{i % 4} epochs" }}'
        lines += [f"[callbacks.cb{i}]", f"trigger = {trig}"]
    path.write_text("\n".join(lines) + "\n")


def best(fn: Callable[[], object], repeats: int = 3) -> float:
    """Best wall time of ``repeats`` calls, in seconds."""
    out = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def startup(args: list[str]) -> float:
    """Best wall time of a fresh interpreter running ``args``, in milliseconds."""
    return 1000 * best(lambda: subprocess.run([sys.executable, *args], cwd=ROOT, check=True,
                                              capture_output=True), repeats=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    quick = parser.parse_args().quick
    sizes = (200, 1000, 2000) if quick else (1000, 5000, 20000)
    print(f"{'callbacks':>10} {'check s':>8} {'us/cb':>7} {'plan s':>8} {'us/cb':>7} "
          f"{'firings':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = Path(tmp) / f"n{n}.toml"
            write_spec(path, n)
            check = best(lambda p=path: load_spec(p))
            spec = load_spec(path)
            plan = best(lambda s=spec: plan_spec(s))
            firings = len(plan_spec(spec).log)
            print(f"{n:>10,} {check:8.2f} {1e6 * check / n:7.0f} {plan:8.2f} "
                  f"{1e6 * plan / n:7.0f} {firings:>9,}")
    print()
    print(f"{'comparisons':>12} {'chars':>10} {'parse s':>8} {'ns/char':>8}")
    for n in (10**3, 10**4) if quick else (10**3, 10**4, 10**5):
        text = " and ".join(f"(m{i} < {i} or not m{i} > 1)" for i in range(n))
        seconds = best(lambda t=text: parse_condition(t))
        print(f"{n:>12,} {len(text):>10,} {seconds:8.3f} {1e9 * seconds / len(text):8.0f}")
    print()
    bare = startup(["-c", "pass"])
    rows = [("bare interpreter", bare),
            ("import schedtrain", startup(["-c", "import schedtrain"])),
            ("from schedtrain import Schedule, every, simulate",
             startup(["-c", "from schedtrain import Schedule, every, simulate"])),
            ("schedtrain check specs/digits.toml",
             startup(["-m", "schedtrain", "check", "specs/digits.toml"])),
            ("schedtrain plan specs/digits.toml",
             startup(["-m", "schedtrain", "plan", "specs/digits.toml"]))]
    for label, ms in rows:
        extra = "" if label.startswith("bare") else f"  (+{ms - bare:.0f} ms over bare)"
        print(f"{label:<52} {ms:6.0f} ms{extra}")
    print("\nreproduce: python benchmarks/bench_scaling.py")


if __name__ == "__main__":
    main()
