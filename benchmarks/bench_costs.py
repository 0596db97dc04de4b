"""How well ``schedtrain plan --costs`` predicts a run's wall time from a shortened one.

Each repeat runs the job (``specs/lm_tokens.toml`` by default: the character LM, 120
steps) cut to ``--short-steps`` steps in a fresh run directory, predicts the full run
with ``schedtrain plan SPEC --costs SHORT/events.jsonl --format json``, runs the full
job, and prints predicted against real: the training time (from the clock's start to
the run's end, what ``--costs`` predicts), each callback's total, the seconds per step,
and the whole process (the short run's start-up added to the prediction). The load
average before and after each run says how busy the machine was: on a shared machine
the seconds per step move with the other jobs, and no model of the run predicts that.

Reproduce, from the repository root (a repeat takes about 35 s on a quiet 2-core
machine, 100 s at a load average of 7):

    python benchmarks/bench_costs.py [--spec specs/lm_tokens.toml] [--short-steps 30]
                                     [--repeats 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from schedtrain.planning.costs import read_costs


def shortened(spec: Path, steps: int, out: Path) -> Path:
    """A copy of ``spec`` whose ``[run]`` stops at ``max_steps = steps``."""
    text = spec.read_text(encoding="utf-8")
    run = re.search(r"^\[run\][^\n]*\n", text, re.MULTILINE)
    if run is None:
        raise SystemExit(f"{spec}: no [run] table; bench_costs needs a spec that trains")
    end = re.search(r"^\[", text[run.end():], re.MULTILINE)
    body_end = run.end() + (end.start() if end else len(text) - run.end())
    body = text[run.end():body_end]
    line = f"max_steps = {steps}\n"
    body, n = re.subn(r"^max_steps\s*=.*\n", line, body, flags=re.MULTILINE)
    if n == 0:
        body = line + body
    out.write_text(text[:run.end()] + body + text[body_end:], encoding="utf-8")
    return out


def train(spec: Path, run_dir: Path) -> float:
    """Run ``schedtrain train`` in a fresh ``run_dir``; return the process's wall time."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "schedtrain", "train", str(spec), "--run-dir",
                    str(run_dir), "--overwrite"], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def measured(run_dir: Path) -> dict[str, Any]:
    """What a finished run took: training time (clock start to ``run.json``'s end), each
    callback's total, the firings, the seconds per step."""
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    firings = [r for r in rows if r.get("kind") == "firing"]
    start = firings[0]["time"] - firings[0]["seconds"]
    end = json.loads((run_dir / "run.json").read_text())["updated"]
    totals: dict[str, float] = {}
    for r in firings:
        totals[r["callback"]] = totals.get(r["callback"], 0.0) + r["duration"]
    return {"training": end - start, "callbacks": totals,
            "firings": [(r["callback"], r["step"]) for r in firings],
            "per_step": read_costs(run_dir / "events.jsonl").seconds_per_step}


def predicted(spec: Path, events: Path) -> dict[str, Any]:
    """``schedtrain plan SPEC --costs EVENTS --format json``'s firings and costs."""
    out = subprocess.run([sys.executable, "-m", "schedtrain", "plan", str(spec), "--costs",
                          str(events), "--format", "json", "--warn-share", "1"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _pct(pred: float, real: float) -> str:
    return f"{100 * (pred / real - 1):+.1f}%" if real > 0 else "n/a"


def repeat(spec: Path, short_steps: int, work: Path) -> dict[str, float]:
    """One short run, its prediction and the full run; prints and returns the figures."""
    short_spec = shortened(spec, short_steps, work / "short.toml")
    load0 = _load()
    short_wall = train(short_spec, work / "short")
    plan = predicted(spec, work / "short" / "events.jsonl")
    load1 = _load()
    full_wall = train(spec, work / "full")
    load2 = _load()
    short, real = measured(work / "short"), measured(work / "full")
    costs = plan["costs"]
    startup = short_wall - short["training"]
    same = [(f["callback"], f["step"]) for f in plan["firings"]] == real["firings"]
    print(f"  load average (1/5/15 min) before short {load0}, before full {load1}, "
          f"after {load2}")
    print(f"  firings planned {len(plan['firings'])} / real {len(real['firings'])}"
          f"{', identical' if same else ', DIFFERENT'}")
    print(f"  s/step: short {short['per_step']:.4f}, predicted "
          f"{costs['step_seconds'] / max(costs['steps'], 1):.4f}, full "
          f"{real['per_step']:.4f}; warm-up {costs['warmup_seconds']:.3f} s, end "
          f"{costs['tail_seconds']:.3f} s")
    for c in costs["callbacks"]:
        got = real["callbacks"].get(c["callback"], 0.0)
        print(f"  {c['callback']:<16} {c['firings']:>4} firings  predicted "
              f"{c['total']:8.3f} s  real {got:8.3f} s  {_pct(c['total'], got)}")
    pred_total = costs["total_seconds"]
    print(f"  training time    predicted {pred_total:8.2f} s  real "
          f"{real['training']:8.2f} s  {_pct(pred_total, real['training'])}")
    print(f"  whole process    predicted {pred_total + startup:8.2f} s  real "
          f"{full_wall:8.2f} s  {_pct(pred_total + startup, full_wall)}  (start-up "
          f"{startup:.2f} s measured in the short run)")
    return {"predicted": pred_total, "real": real["training"],
            "process_predicted": pred_total + startup, "process_real": full_wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=Path("specs/lm_tokens.toml"))
    parser.add_argument("--short-steps", type=int, default=30,
                        help="steps of the shortened run the costs come from")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the runs under this folder (default: a temporary one)")
    args = parser.parse_args()
    print(f"bench_costs: {args.spec}, costs from {args.short_steps} steps, "
          f"{args.repeats} repeats, {os.cpu_count()} CPUs")
    print(f"reproduce: python benchmarks/bench_costs.py --spec {args.spec} "
          f"--short-steps {args.short_steps} --repeats {args.repeats}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        for i in range(1, args.repeats + 1):
            work = root / f"repeat{i}"
            work.mkdir(parents=True, exist_ok=True)
            print(f"repeat {i}:")
            results.append(repeat(args.spec, args.short_steps, work))
    print("| repeat | predicted | real | error | process predicted | process real | error |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(results, 1):
        print(f"| {i} | {r['predicted']:.2f} s | {r['real']:.2f} s | "
              f"{_pct(r['predicted'], r['real'])} | {r['process_predicted']:.2f} s | "
              f"{r['process_real']:.2f} s | "
              f"{_pct(r['process_predicted'], r['process_real'])} |")


if __name__ == "__main__":
    main()
