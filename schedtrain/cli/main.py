"""The ``schedtrain`` command: ``check``, ``plan`` and ``train`` a TOML schedule.

Exit codes: 0 success, 2 bad input (a spec or the arguments), 1 a failure while
running. A user error prints what is wrong, never a Python traceback. This is
the only module that configures logging (``structlog.configure``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Final

from schedtrain.cli import preflight
from schedtrain.cli.parser import build_parser
from schedtrain.cli.preflight import UsageError, derived_clock
from schedtrain.cli.preflight import print_warnings as _warn
from schedtrain.errors import (
    PATH_LIMIT,
    SHOWN_PROBLEMS,
    PortingWarning,
    Preempted,
    Problem,
    RunDirError,
    RunEnded,
    ScheduleError,
    ScheduleWarning,
    failure_place,
    one_line,
    traceback_file,
    with_head,
)
from schedtrain.files import write_atomic
from schedtrain.planning.auto import (
    AutoPlan,
    auto_savers,
    auto_table,
    declare_auto,
    logged_save_cost,
    logged_step_time,
)
from schedtrain.planning.plan import PlanError
from schedtrain.simulation.metric_stream import MetricStreamError
from schedtrain.spec import load_spec
from schedtrain.urls import redact_text

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_BAD_INPUT: Final = 2
#: SIGTERM/SIGINT stopped training after a checkpoint: run again with --resume auto
#: (sysexits' EX_TEMPFAIL, "try again later").
EXIT_PREEMPTED: Final = 75
#: A second Ctrl-C: stopped at once, no checkpoint of the step in progress (128 + SIGINT).
EXIT_INTERRUPTED: Final = 130



def _configure_logging(verbose: bool) -> None:
    level = 10 if verbose else 30  # DEBUG / WARNING
    import structlog  # only `train` logs: check and plan start without it

    console = structlog.dev.ConsoleRenderer(colors=False)

    def render(logger: Any, method: str, event: Any) -> Any:
        # An event that carries its own sentence is said as the other CLI lines are.
        line = event.get("line")
        return line if isinstance(line, str) else console(logger, method, event)

    structlog.configure(
        processors=[structlog.processors.add_log_level, render],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # Look sys.stderr up when a logger is made, not now: it may be replaced later.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
        cache_logger_on_first_use=False,
    )


def _report(problems: Sequence[Problem], err: IO[str]) -> None:
    """One line per problem, the first ``SHOWN_PROBLEMS`` of them, then how many more."""
    for p in problems[:SHOWN_PROBLEMS]:
        print(f"error: {p}", file=err)
    if len(problems) > SHOWN_PROBLEMS:
        where = f"{one_line(problems[0].file, PATH_LIMIT)}: " if problems[0].file else ""
        print(f"error: {where}... and {len(problems) - SHOWN_PROBLEMS} more problems", file=err)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# -- check ------------------------------------------------------------------------------


def _cmd_check(args: argparse.Namespace) -> int:
    failed = False
    for path in args.specs:
        try:
            spec, notes = preflight.checked(load_spec(path, imports=args.do_import),
                                            args.do_import, args.host, nproc=args.nproc,
                                            path=path)
        except ScheduleError as exc:
            _report(exc.problems, sys.stderr)
            print(f"{path}: {_plural(len(exc.problems), 'problem')}", file=sys.stderr)
            failed = True
            continue
        _warn(path, [*spec.warnings, *notes], sys.stderr)
        for target in spec.unimported:
            print(with_head(f"note: {one_line(path, PATH_LIMIT)}: ",
                            f"custom trigger {target!r} was not imported; --import imports it "
                            "(and runs its module) to check it fully"), file=sys.stderr)
        print(f"{path}: ok: {_plural(len(spec.callbacks), 'callback')}, "
              f"{_plural(len(spec.triggers), 'named trigger')}, "
              f"{_plural(len(spec.events), 'custom event')}, "
              f"{_plural(len(spec.warnings) + len(notes), 'warning')}")
    return EXIT_BAD_INPUT if failed else EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    from schedtrain.planning import render as plan_render
    from schedtrain.planning.plan import plan_spec
    from schedtrain.simulation.metric_stream import read_metrics

    spec = load_spec(args.spec, imports=args.do_import)
    counts = args.do_import and not preflight.hosted(spec, args.host)
    task = preflight.plan_task(spec) if counts else None
    nproc = preflight.counted_processes(spec, counts, args.nproc)
    spec, notes = derived_clock(spec, counts, task, nproc)
    _warn(args.spec, notes, sys.stderr)
    preflight.one_process_note(args.spec, spec, nproc, counts)
    size = args.checkpoint_size
    if size is None and task is not None:
        from schedtrain.checkpoints.size import estimate_checkpoint_bytes

        size = estimate_checkpoint_bytes(task.model, task.optimizer)
    metrics = read_metrics(args.metrics) if args.metrics else None
    autos = _declare_auto(spec, args)
    with warnings.catch_warnings():  # a schedule's warnings as one line each, not Python's
        warnings.showwarning = _warning_printer(args.spec)
        plan = plan_spec(spec, metrics, epochs=args.epochs,
                         steps_per_epoch=args.steps_per_epoch, host=args.host)
    if plan.truncated:
        print(f"warning: stopped after {len(plan.log):,} firings; plan a shorter run with "
              "--epochs/--steps-per-epoch", file=sys.stderr)
    for note in plan.notes:
        print(with_head("warning: ", note), file=sys.stderr)
    if args.format == "png":
        out = args.out or "plan.png"
        try:
            plan_render.render_png(plan, out)
        except plan_render.PngUnavailable as exc:
            print(with_head("error: ", str(exc)), file=sys.stderr)
            return EXIT_FAILURE
        print(f"wrote {out}")
        return EXIT_OK
    text = (plan_render.render_json(plan, size) if args.format == "json"
            else plan_render.render_table(plan, args.first, size, saves=any(  # ours, not a host's
                saver.kind in ("model", "best", "topk") for saver in plan.keep.values())))
    if args.costs:
        text = _with_costs(plan, args, text)
    if autos and args.format == "json":
        text = json.dumps({**json.loads(text), "auto_intervals": [a.to_dict() for a in autos]},
                          indent=2) + "\n"
    elif autos:
        text += auto_table(autos)
    if args.out:
        # Replaced whole: a link planted at --out is replaced, never written through.
        write_atomic(Path(args.out), lambda f: f.write(text.encode()))
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _declare_auto(spec: Any, args: argparse.Namespace) -> list[AutoPlan]:
    """The intervals of ``every = "auto"`` savers, declared to their triggers for the plan."""
    names = auto_savers(spec)
    if not names:
        return []
    if args.checkpoint_seconds is None and not args.costs:
        print(f"warning: {args.spec}: every = \"auto\" is planned at its start interval; "
              "--checkpoint-seconds S or --costs EVENTS gives its decided one",
              file=sys.stderr)
        return []
    from schedtrain.planning.costs import read_costs

    costs = read_costs(args.costs) if args.costs else None
    cost, step = {}, {}
    for name in names:
        got = args.checkpoint_seconds
        if got is None and costs is not None:
            got = logged_save_cost(args.costs, name) or costs.per_firing(name) or None
        if got is not None:
            cost[name] = got
        # As the run measured it (no save stalls in it), else the firings' stamps.
        per = (logged_step_time(args.costs, name) or costs.seconds_per_step
               if costs is not None else spec.clock.seconds_per_step)
        if per is not None:
            step[name] = per
    return declare_auto(spec, cost_s=cost, step_s=step,
                        restart_s=costs.warmup if costs is not None else 0.0)


def _with_costs(plan: Any, args: argparse.Namespace, text: str) -> str:
    """The plan's text with ``--costs`` applied: a warning per callback over the share."""
    from schedtrain.planning import costs

    pred = costs.predict(plan, costs.read_costs(args.costs))
    for c in pred.over(args.warn_share):
        print(f"warning: callbacks.{c.callback} takes {c.share:.0%} of the predicted run "
              f"({c.firings:,} firings, {c.total:.3g} s; threshold "
              f"{args.warn_share:.0%}, --warn-share)", file=sys.stderr)
    if args.format == "json":
        return costs.cost_json(plan, pred)
    return text + costs.cost_table(pred)


# -- train ------------------------------------------------------------------------------


def _cmd_train(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec, imports=True)  # custom trigger classes run in training
    try:
        from schedtrain.training import train_from_spec
        from schedtrain.training.control.schedule_change import ScheduleChanged
        from schedtrain.training.threads import limit_cpu_threads
    except ImportError as exc:
        print("error: schedtrain train needs schedtrain.training (and torch), which cannot "
              f"be imported: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if spec.run is not None:
        limit_cpu_threads(spec.run.device)  # unless OMP_NUM_THREADS says otherwise
    try:
        with warnings.catch_warnings():
            # A schedule's warnings as the user's lines, not as Python's (file:line).
            warnings.showwarning = _warning_printer(args.spec)
            trainer = train_from_spec(spec, args.run_dir, args.resume,
                                      overwrite=args.overwrite,
                                      schedule_change=args.schedule_change)
    except ScheduleChanged as exc:  # every rank refuses alike; the chief says why
        if os.environ.get("RANK", "0") == "0":
            # its diff is a table of lines, each kept within a line's 300 characters
            first, *rest = str(exc).splitlines() or [""]
            print("\n".join([with_head("error: ", first), *map(one_line, rest)]),
                  file=sys.stderr)
        return EXIT_BAD_INPUT
    except RunEnded as exc:
        if args.resume != "auto":
            print(with_head("error: ", str(exc)), file=sys.stderr)
            return EXIT_BAD_INPUT
        # A requeued job whose run already ended: nothing to do is success, not failure.
        print(f"the run {exc.status} at step {exc.step}; nothing left to do", file=sys.stderr)
        return EXIT_OK
    except RunDirError as exc:
        print(with_head("error: ", str(exc)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # a second Ctrl-C: no checkpoint of the step in progress
        from schedtrain.training.from_spec import interrupted_line

        print(interrupted_line(spec, args.run_dir), file=sys.stderr)
        return EXIT_INTERRUPTED
    except Preempted as exc:
        if os.environ.get("RANK", "0") != "0":  # the chief reports for every rank
            return EXIT_PREEMPTED
        again = ["schedtrain", "train", args.spec, "--resume", "auto"]
        if args.run_dir:
            again[3:3] = ["--run-dir", args.run_dir]
        print(f"preempted by {exc.signal} after step {exc.step}: "
              + (f"checkpoint {exc.checkpoint}; resume with: {' '.join(again)}"
                 if exc.checkpoint else "no run directory, nothing saved"), file=sys.stderr)
        return EXIT_PREEMPTED
    if trainer.rank != 0:  # the chief reports for every rank
        return EXIT_OK
    print(_ending(trainer))
    ts = trainer.clock.now()
    shown = [f"{n}={mv.value:.4g}" for n in trainer.metrics.names()
             if n.startswith("val/") and (mv := trainer.metrics.latest(n)) is not None]
    print(f"trained {ts.epoch} epochs, {ts.step} steps in {ts.seconds:.1f} s"
          + (f"; {', '.join(shown)}" if shown else "")
          + (f"; run directory {trainer.run_dir}" if trainer.run_dir else ""))
    return EXIT_OK


def _warning_printer(path: str) -> Callable[..., None]:
    def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
        if issubclass(category, ScheduleWarning):
            print(with_head(f"warning: {one_line(path, PATH_LIMIT)}: ", str(message)),
                  file=sys.stderr)
        else:
            print(with_head(f"warning: {category.__name__}: ", str(message)), file=sys.stderr)
    return show


def _ending(trainer: Any) -> str:
    """Why the run ended: who stopped it and why, or the limit it reached."""
    ts = trainer.clock.now()
    stopped = trainer.stopped
    if stopped is not None:
        reason: str = stopped.reason
        place: str | None = stopped.place
        if reason and reason.startswith("stopped by"):
            return reason
        return (f"stopped by {place}" if place else f"stopped at epoch {ts.epoch} (step "
                f"{ts.step})") + f": {reason or 'StopTraining was raised'}"
    config = trainer.config
    if config.max_steps is not None and ts.step >= config.max_steps:
        return f"finished: reached max_steps = {config.max_steps} at epoch {ts.epoch}"
    if config.max_epochs is not None:
        return f"finished: reached max_epochs = {config.max_epochs} at step {ts.step}"
    return f"finished at epoch {ts.epoch} (step {ts.step})"


def _cmd_diff(args: argparse.Namespace) -> int:
    from schedtrain.cli.diff import cmd_diff

    return cmd_diff(args)


def _cmd_retime(args: argparse.Namespace) -> int:
    from schedtrain.cli.retime import cmd_retime

    return cmd_retime(args)


def _cmd_status(args: argparse.Namespace) -> int:
    from schedtrain.cli.status import cmd_status

    return cmd_status(args)


_COMMANDS = {"check": _cmd_check, "plan": _cmd_plan, "diff": _cmd_diff, "train": _cmd_train,
             "retime": _cmd_retime, "status": _cmd_status}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``schedtrain`` command line; returns the exit code.

    Args:
        argv: the arguments (without the program name); ``sys.argv[1:]`` by default.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:  # argparse printed the usage; now the reason, no traceback
        print(one_line(str(exc)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except SystemExit as exc:  # --help exits 0 through argparse
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    if args.command == "train":
        _configure_logging(args.verbose)
    try:
        with warnings.catch_warnings():
            # Raised while importing a spec's classes; check --import and train report each
            # for the spec's callbacks as one line of their own (prepare_run's notes).
            warnings.filterwarnings("ignore", category=PortingWarning)
            return _COMMANDS[args.command](args)
    except ScheduleError as exc:  # SpecError included
        _report(exc.problems, sys.stderr)
        return EXIT_BAD_INPUT
    except (UsageError, PlanError, MetricStreamError) as exc:
        print(with_head("error: ", str(exc)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.traceback:
            traceback.print_exc()
        rank = os.environ.get("RANK") if os.environ.get("WORLD_SIZE", "1") != "1" else None
        print(_failure_line(exc, rank, args.traceback), file=sys.stderr)
        return EXIT_FAILURE


def _failure_line(exc: BaseException, rank: str | None, shown: bool) -> str:
    """One line for a failure: where in the run it was raised, what, and where the
    full traceback is."""
    where = f" on rank {rank}" if rank is not None else ""
    text = str(exc).strip().splitlines()
    what = type(exc).__name__ + (f": {text[0]}" if text else "") + (" ..." if len(text) > 1
                                                                      else "")
    place = failure_place(exc)
    saved = traceback_file(exc)
    line = f"error{where}: " + redact_text(f"{place} raised {what}" if place else what)
    if saved is not None:
        line += f"; traceback in {saved}"
    elif not shown:
        line += " (run with --traceback for details)"
    return one_line(line)
