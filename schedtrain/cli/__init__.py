"""The ``schedtrain`` command line: a thin shell over the library.

``main`` parses the arguments and runs a command (``check``, ``plan``, ``train``),
returning the exit code; ``entry`` ends the process (``schedtrain`` and
``python -m schedtrain`` go through ``run``).
"""

from schedtrain.cli.entry import run as run
from schedtrain.cli.main import main as main

__all__ = ["main", "run"]
