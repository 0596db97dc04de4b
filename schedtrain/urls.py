"""Storage URLs (``s3://bucket/ck``): which package each protocol needs, without importing it.

The torch-free half of checkpoint storage: ``schedtrain check`` and ``train`` refuse a
URL whose package is missing, naming the extra that installs it, before anything runs.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Final

__all__ = ["is_url", "missing_package"]

#: protocol -> (the package fsspec needs for it, the schedtrain extra that installs it)
PACKAGES: Final = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"),
                   "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}
_URL_RE: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def is_url(location: object) -> bool:
    """Whether ``location`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(location, str) and _URL_RE.match(location) is not None


def missing_package(url: str) -> str | None:
    """Why ``url`` cannot be opened here (its package is not installed), or ``None``."""
    m = _URL_RE.match(url)
    protocol = m[1].lower() if m else ""
    package, extra = PACKAGES.get(protocol, (None, "s3"))
    for needed in ("fsspec", package):
        if needed is not None and importlib.util.find_spec(needed) is None:
            return (f"a {protocol}:// URL needs the {needed} package: "
                    f"pip install 'schedtrain[{extra}]'")
    return None
