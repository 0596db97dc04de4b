"""Wall time of ``schedtrain plan --format json`` on 100 callbacks over 10^9 steps.

Writes a spec of 100 callbacks (every-N-steps, epoch periods with a condition,
windowed ``any`` with ``train_end``, and ``at`` points) over 1000 epochs of 10^6
steps, then times the real command line, Python start-up included, best of 3.

Reproduce: ``python benchmarks/bench_plan.py``
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_spec(path: Path, seed: int = 1) -> None:
    """The 100-callback spec, deterministic for ``seed``."""
    rng = random.Random(seed)
    lines = ["[clock]", "epochs = 1000", "steps_per_epoch = 1_000_000", ""]
    for i in range(100):
        kind = i % 4
        if kind == 0:
            trig = f'{{ every = "{rng.randrange(10**7, 10**8)} steps" }}'
        elif kind == 1:
            trig = f'{{ every = "{rng.randrange(50, 200)} epochs", if = "val/loss < 0.5" }}'
        elif kind == 2:
            trig = (f'{{ any = [{{ every = "{rng.randrange(10**7, 10**8)} steps", '
                    f'start = "100 epochs" }}, {{ on = "train_end" }}] }}')
        else:
            trig = (f'{{ at = ["{rng.randrange(1, 10**9)} steps", '
                    f'"{rng.randrange(1, 1000)} epochs"] }}')
        lines += [f"[callbacks.cb{i}]", f"trigger = {trig}", ""]
    path.write_text("\n".join(lines))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "huge100.toml"
        write_spec(spec)
        cmd = [sys.executable, "-m", "schedtrain", "plan", str(spec), "--format", "json"]
        best, out = float("inf"), ""
        for _ in range(3):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            best = min(best, time.perf_counter() - t0)
        startup = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import schedtrain.cli"], check=True)
            startup = min(startup, time.perf_counter() - t0)
    firings = len(json.loads(out)["firings"])
    print(f"schedtrain plan --format json, 100 callbacks, 10^9 steps: {best:.2f} s wall "
          f"(best of 3), {firings:,} firings; Python start-up + import: {startup:.2f} s")
    print("reproduce: python benchmarks/bench_plan.py")


if __name__ == "__main__":
    main()
