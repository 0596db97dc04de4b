"""What a fresh process imports: every `schedtrain` command, torchrun rank and example pays
its imports again, so a part used only on a rare path is imported on that path.

Each test runs one fresh interpreter: in this process everything is imported already.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from schedtrain.spec.registry import BUILTINS

SPEC = Path(__file__).resolve().parents[2] / "specs" / "digits.toml"
#: What the trainer builds itself (the run's checkpoints: ``ModelSaver``, whose module
#: holds ``TopKSaver`` too): the built-in callback modules that importing it may import.
TRAINER_BUILDS = {"schedtrain.callbacks.saver", "schedtrain.callbacks.topk"}


def _run(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_check_and_plan_run_without_torch_or_structlog() -> None:
    """`schedtrain check` and `plan` run with torch unimportable, and import no structlog
    (only `train` logs)."""
    _run("import sys; sys.modules['torch'] = None\n"
         "from schedtrain.cli import main\n"
         f"assert main(['check', {str(SPEC)!r}]) == 0\n"
         f"assert main(['plan', {str(SPEC)!r}]) == 0\n"
         "loaded = [m for m in sys.modules if sys.modules[m] is not None]\n"
         "assert not [m for m in loaded if m.split('.')[0] in ('torch', 'structlog')], loaded\n")


def test_the_trainer_imports_rare_parts_only_when_used() -> None:
    """Importing the trainer (what a rank or a script using the Python API imports; the
    CLI imports the spec loader and the planner itself) imports neither structlog, the
    planner, the spec loader nor any built-in callback's module but the saver's; each
    loads when first used: a name of ``schedtrain.callbacks`` when named, structlog when a
    library logger is."""
    families = sorted({b.target.split(":")[0] for b in BUILTINS.values()} - TRAINER_BUILDS)
    rare = ["structlog", "schedtrain.planning.plan", "schedtrain.spec.load", *families]
    _run("import sys\n"
         "import schedtrain.training\n"
         f"early = [m for m in {rare!r} if m in sys.modules]\n"
         "assert early == [], early\n"
         "import schedtrain.callbacks as c\n"
         "from schedtrain.callbacks import ProgressBar\n"
         "assert 'schedtrain.callbacks.progress' in sys.modules\n"
         "assert set(c.__all__) <= set(dir(c))\n"
         "assert all(getattr(c, n) is not None for n in c.__all__)\n"
         f"assert all(m in sys.modules for m in {families!r})\n"
         "from schedtrain.training.fit import _log\n"
         "from schedtrain.logs import is_configured\n"
         "assert not is_configured() and 'structlog' not in sys.modules\n"
         "_log.bind()\n"
         "assert 'structlog' in sys.modules\n")
