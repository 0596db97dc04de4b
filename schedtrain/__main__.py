"""``python -m schedtrain``: the command line."""

from schedtrain.cli.entry import run

run()
