"""``python -m schedtrain``: the command line."""

from schedtrain.entry import run

run()
