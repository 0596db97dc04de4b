"""How the command line's process ends (``schedtrain`` and ``python -m schedtrain``)."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

__all__ = ["exit_process", "run"]


def exit_process(code: int) -> NoReturn:
    """Exit with ``code``.

    A process that was one of several (``WORLD_SIZE > 1``, as ``torchrun`` sets it)
    flushes its output and leaves with ``os._exit``, skipping the interpreter's
    shutdown: there, after a run that finished and destroyed its process group, gloo's
    threads now and then aborted a rank (SIGABRT, "terminate called without an active
    exception"), which fails the whole ``torchrun`` job. Everything a run writes is
    closed before this point.
    """
    world = os.environ.get("WORLD_SIZE", "1").strip()
    # a WORLD_SIZE that is no number was refused by the command (plan --import): no rank
    if world.isdecimal() and len(world) < 10 and int(world) > 1:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def run() -> NoReturn:
    """The ``schedtrain`` command: ``cli.main`` with the process's arguments."""
    from schedtrain.cli.main import main

    exit_process(main())
