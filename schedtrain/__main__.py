"""``python -m schedtrain``: the command line."""

import sys

from schedtrain.cli import main

sys.exit(main())
