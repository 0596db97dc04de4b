"""The worked examples in the docs and README run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


@pytest.mark.parametrize("name", ["README.md", "docs/testing.md"])
def test_first_python_block_runs(name: str) -> None:
    """The first Python example of the page runs, and every test function in it passes."""
    namespace: dict[str, object] = {}
    exec(_blocks(ROOT / name)[0], namespace)
    tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    for test in tests:
        test()
