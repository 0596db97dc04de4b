"""The package's version, in a module of its own: what records it (an exported file's
metadata) reads it here without importing the package face, and the build reads it
from this file (pyproject's ``[tool.hatch.version]``)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
