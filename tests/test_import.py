"""The torch-free core imports without torch."""

from __future__ import annotations

import subprocess
import sys

CORE = ["schedtrain", "schedtrain.time", "schedtrain.clock", "schedtrain.triggers",
        "schedtrain.table", "schedtrain.schedule", "schedtrain.simulation", "schedtrain.testing",
        "schedtrain.triggers.tensorpack", "schedtrain.spec", "schedtrain.toml_writer",
        "schedtrain.registry", "schedtrain.cli"]


def test_core_imports_with_torch_unimportable() -> None:
    """``import schedtrain`` and every core module work with torch made unimportable."""
    code = ("import sys; sys.modules['torch'] = None\n"
            + "".join(f"import {m}\n" for m in CORE)
            + "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr


def test_public_names_are_exported() -> None:
    """Everything in ``schedtrain.__all__`` exists."""
    import schedtrain

    missing = [n for n in schedtrain.__all__ if not hasattr(schedtrain, n)]
    assert missing == []
