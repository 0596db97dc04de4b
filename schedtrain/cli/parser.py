"""The ``schedtrain`` command line's grammar: its commands, options and help."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from schedtrain.cli import preflight
from schedtrain.cli.preflight import UsageError
from schedtrain.errors import number_text, one_line, shorten
from schedtrain.time import MAX_COUNT

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so ``main`` returns the exit code."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        # argparse echoes what was given (a value, a choice): one bounded line.
        raise UsageError(one_line(f"{self.prog}: error: {message}"))


#: ``--host``: the schedule runs inside one of them (docs/integrations.md).
HOSTS = ("lightning", "transformers", "ignite")
HOST_HELP = ("the schedule runs inside this host (lightning, transformers, ignite), as a "
             "spec without [run] does: the host produces the metrics and writes the "
             "checkpoints, [run] is not checked")
_CHECK_EPILOG = """\
examples:
  schedtrain check specs/resnet_tensorpack.toml
  schedtrain check specs/*.toml --import    # also import "module:Class" types
"""
_PLAN_EPILOG = """\
examples:
  schedtrain plan specs/resnet_tensorpack.toml
  schedtrain plan specs/lm_plan_only.toml --format json > firings.json
  schedtrain plan specs/early_stopping.toml --metrics runs/x/events.jsonl
  schedtrain plan specs/digits_ddp.toml --import --nproc 2   # a rank's steps on 2
  schedtrain plan specs/resnet_tensorpack.toml --format png --out plan.png
"""
_DIFF_EPILOG = """\
examples:
  schedtrain diff specs/digits.toml specs/digits_30_steps.toml
  schedtrain diff runs/digits specs/digits.toml     # what --resume auto would change
  schedtrain diff old.toml new.toml --epochs 4 --steps-per-epoch 45 --from 90

exit codes: 0 equal, 1 different, 2 bad input
"""
_TRAIN_EPILOG = """\
examples:
  schedtrain train specs/digits.toml
  schedtrain train specs/digits.toml --run-dir runs/try2 --resume auto
  schedtrain train specs/digits.toml --overwrite     # start the run again

exit codes: 0 done, 1 training failed, 2 bad input (spec, arguments, a run directory
in use or holding a run), 75 preempted (SIGTERM/SIGINT) after a checkpoint: run again
with --resume auto
"""


@functools.cache  # parsing does not change it; built once per process
def build_parser() -> argparse.ArgumentParser:
    """The ``schedtrain`` command's arguments: ``check``, ``plan``, ``diff``, ``train``,
    ``retime`` and ``status``."""
    parser = _Parser(
        prog="schedtrain",
        description="Check, plan and run declarative training schedules written in TOML.",
        epilog="run 'schedtrain COMMAND --help' for a command's options",
    )
    parser.add_argument("--traceback", action="store_true",
                        help="print the Python traceback of a failure (for bug reports)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    fmt = argparse.RawDescriptionHelpFormatter

    check = sub.add_parser("check", help="validate spec files", epilog=_CHECK_EPILOG,
                           formatter_class=fmt,
                           description="Validate spec files; exit 0, or 2 listing every problem.")
    check.add_argument("specs", nargs="+", metavar="SPEC", help="TOML spec files")
    check.add_argument("--host", choices=HOSTS, metavar="HOST",
                       help=HOST_HELP)
    check.add_argument("--import", dest="do_import", action="store_true",
                       help="import 'module:Class' callback and trigger classes and check "
                            "their arguments (this runs code from those modules)")
    _add_nproc(check)

    plan = sub.add_parser("plan", help="simulate a spec and show when callbacks fire",
                          epilog=_PLAN_EPILOG, formatter_class=fmt,
                          description="Simulate the schedule over the run's shape ([clock] "
                                      "or the options) and show every firing.")
    plan.add_argument("spec", metavar="SPEC", help="a TOML spec file")
    plan.add_argument("--epochs", type=_positive_int, metavar="N", help="override clock.epochs")
    plan.add_argument("--steps-per-epoch", type=_positive_int, metavar="S",
                      help="override clock.steps_per_epoch")
    plan.add_argument("--format", choices=("table", "json", "png"), default="table",
                      help="table (default), json ({\"firings\": [...]}) or png (a timeline)")
    plan.add_argument("--out", metavar="FILE",
                      help="write to FILE instead of stdout (png default: plan.png)")
    plan.add_argument("--metrics", metavar="FILE",
                      help="JSONL metric stream ({\"name\", \"value\", \"step\"|\"epoch\"} per "
                           "line, or a run's events.jsonl) to resolve conditional firings")
    plan.add_argument("--costs", metavar="EVENTS",
                      help="a previous run's events.jsonl: predict each callback's cost and "
                           "the run's wall time from its measured durations")
    plan.add_argument("--warn-share", type=_share, default=0.10, metavar="F",
                      help="with --costs, warn when a callback takes more than this share "
                           "of the run (default 0.10)")
    plan.add_argument("--first", type=_positive_int, default=5, metavar="N",
                      help="firings listed per callback in the table (default 5)")
    plan.add_argument("--checkpoint-size", type=preflight.size_argument, metavar="SIZE",
                      help="one checkpoint's size ('4GB', '500 MB'): the plan gives the "
                           "peak disk its ModelSavers' files take")
    plan.add_argument("--checkpoint-seconds", type=_positive_seconds, metavar="S",
                      help="what one save costs (seconds): every = \"auto\" savers get "
                           "their interval, work lost per failure and overhead from it")
    plan.add_argument("--host", choices=HOSTS, metavar="HOST", help=HOST_HELP)
    plan.add_argument("--import", dest="do_import", action="store_true",
                      help="import custom trigger classes ({ custom = \"module:Class\" }); "
                           "this runs code from those modules")
    _add_nproc(plan)

    diff = sub.add_parser("diff", help="compare two schedules and the firings they make",
                          epilog=_DIFF_EPILOG, formatter_class=fmt,
                          description="Compare two schedules (each a spec file, a run "
                                      "directory or a checkpoint): the spec's changes by key "
                                      "path, and over a simulated run the firings each "
                                      "callback gains, loses or moves.")
    diff.add_argument("old", metavar="OLD", help="a spec, a run directory or a checkpoint "
                                                 "(a path or a URL such as s3://...)")
    diff.add_argument("new", metavar="NEW", help="a spec, a run directory or a checkpoint")
    diff.add_argument("--epochs", type=_positive_int, metavar="N", help="override clock.epochs")
    diff.add_argument("--steps-per-epoch", type=_positive_int, metavar="S",
                      help="override clock.steps_per_epoch")
    diff.add_argument("--from", dest="from_step", type=_whole, metavar="STEP",
                      help="compare the firings after STEP, NEW taking over from OLD there "
                           "as a resume with --schedule-change apply would (default: the "
                           "step of a checkpoint or of a run directory's checkpoint, else "
                           "the whole run)")
    diff.add_argument("--import", dest="do_import", action="store_true",
                      help="build a spec's [run] task to count its steps per epoch, as "
                           "plan --import does (a spec with [run] and no [clock])")
    _add_nproc(diff)
    diff.add_argument("--format", choices=("table", "json"), default="table",
                      help="table (default) or json")
    diff.add_argument("--first", type=_positive_int, default=5, metavar="N",
                      help="firings listed per callback and kind in the table (default 5)")

    train = sub.add_parser("train", help="train with a spec's [run] and callbacks",
                           epilog=_TRAIN_EPILOG, formatter_class=fmt,
                           description="Run training as the spec's [run] table describes.")
    train.add_argument("spec", metavar="SPEC", help="a TOML spec file")
    train.add_argument("--run-dir", metavar="DIR", help="override run.run_dir")
    train.add_argument("--overwrite", action="store_true",
                       help="start afresh in a run directory that holds a run (removes its "
                            "log and checkpoints)")
    train.add_argument("--resume", metavar="PATH|URL|auto",
                       help="resume from a checkpoint (a file, or its URL in the run's "
                            "checkpoint_dir), or 'auto' for the newest in the run dir")
    train.add_argument("--schedule-change", choices=("refuse", "apply"), default="refuse",
                       help="resuming a checkpoint saved with another schedule: refuse "
                            "(default; shows the diff) or apply the new one by the rules "
                            "of docs/checkpoints.md")
    _add_retime(sub)
    _add_status(sub)
    return parser


_RETIME_EPILOG = """\
examples:
  schedtrain retime runs/digits specs/digits_30_steps.toml
  schedtrain retime runs/digits new.toml --wait 60    # until the job has applied it

exit codes: 0 handed (with --wait: applied), 1 the job is still starting (retry, or
--wait) or no answer within --wait (the request stays), 2 bad input, no job running
there, or a change a running job cannot make
"""


def _add_nproc(command: Any) -> None:
    command.add_argument("--nproc", type=_nproc, metavar="N",
                         help="with --import, count the steps per epoch of one of N processes "
                              "(torchrun --nproc-per-node x nodes), divided as the run "
                              "divides the data; default: WORLD_SIZE where set, else 1")


def _add_retime(sub: Any) -> None:
    retime = sub.add_parser(
        "retime", help="hand a running job a new schedule", epilog=_RETIME_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check a new spec's schedule against the one the job in RUN_DIR runs, "
                    "print the diff of the next firings and hand it to the job, which "
                    "applies it at its next slow-path step by the rules of "
                    "--schedule-change apply (docs/checkpoints.md, \"Live retime\").")
    retime.add_argument("run_dir", metavar="RUN_DIR", help="the running job's run directory")
    retime.add_argument("new", metavar="NEW", help="a TOML spec file")
    retime.add_argument("--wait", type=_seconds, metavar="SECONDS",
                        help="wait up to SECONDS for the job's answer (applied or refused)")
    retime.add_argument("--epochs", type=_positive_int, metavar="N",
                        help="override clock.epochs (for the diff)")
    retime.add_argument("--steps-per-epoch", type=_positive_int, metavar="S",
                        help="override clock.steps_per_epoch (for the diff)")
    retime.add_argument("--first", type=_positive_int, default=5, metavar="N",
                        help="firings listed per callback and kind (default 5)")


_STATUS_EPILOG = """\
examples:
  schedtrain status runs/digits
  torchrun --nproc-per-node 2 -m schedtrain train job.toml --run-dir runs/job
  schedtrain status runs/job; code=$?    # 75: preempted, requeue with --resume auto

exit codes: as train's for that ending: 0 finished or stopped, 75 preempted, 1 failed or
still running (or killed before it could record its end), 2 no run.json or a damaged one
"""


def _add_status(sub: Any) -> None:
    status = sub.add_parser(
        "status", help="how the run in a run directory ended (exit 75: preempted)",
        epilog=_STATUS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print RUN_DIR's run.json status in one line and exit with the code "
                    "`train` gives for it; a launcher such as torchrun exits 1 when its "
                    "ranks exit 75 (docs/distributed.md, \"Preemption\").")
    status.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")


def _given(text: str) -> str:
    """What the user gave, as a refusal names it: a huge number by its digit count."""
    return number_text(text) or repr(shorten(text))


def _parse_seconds(text: str, *, zero: bool) -> float:
    try:
        value = -1.0 if number_text(text) else float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0.0 if zero else value > 0.0) or value == float("inf"):
        bound = ">= 0" if zero else "> 0"
        raise argparse.ArgumentTypeError(f"expected seconds {bound}, got {_given(text)}")
    return value


def _seconds(text: str) -> float:
    return _parse_seconds(text, zero=True)


def _positive_seconds(text: str) -> float:
    return _parse_seconds(text, zero=False)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a share between 0 and 1, got {_given(text)}")
    return value


def _whole_number(minimum: int, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """An argument type: a whole number from ``minimum`` to ``maximum``."""
    def parse(text: str) -> int:
        huge = number_text(text)
        if huge is not None:  # int() would refuse it in Python's words, or take seconds
            raise argparse.ArgumentTypeError(
                f"expected a whole number of at most {maximum:,}, got {huge}")
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number, got {_given(text)}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from {minimum} to {maximum:,}, got {value}")
        return value
    return parse


_positive_int = _whole_number(1)
_nproc = _whole_number(1, preflight.MAX_RANKS)
_whole = _whole_number(0)
