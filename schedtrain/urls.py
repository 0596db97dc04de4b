"""Storage URLs (``s3://bucket/ck``): which package each protocol needs, which URLs can
hold a run's checkpoints, and how a URL is shown, all without importing fsspec.

The torch-free half of checkpoint storage: ``schedtrain check`` and ``train`` refuse a
URL whose package is missing (naming the extra that installs it), one with credentials
in it, one naming no bucket, a ``memory://`` one and a relative ``file://`` one, before
anything runs. ``redact`` is the one function that shows a URL: user-info (``KEY:SECRET@``)
never reaches a message, ``run.json``, ``events.jsonl`` or ``traceback.txt``.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Final

__all__ = ["is_url", "missing_package", "redact", "redact_text", "url_problem"]

#: protocol -> (the package fsspec needs for it, the schedtrain extra that installs it)
PACKAGES: Final = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"),
                   "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}
_URL_RE: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
#: ``scheme://user-info@``: with a password (``KEY:SECRET@``, which may hold ``/`` as an
#: AWS secret does) or a bare user name (no ``/``), anywhere in a text.
_USERINFO_RE: Final = re.compile(
    r"\b([A-Za-z][A-Za-z0-9+.-]*://)(?:[^\s@/:'\"]*:[^\s@'\"]*|[^\s@/:'\"]+)@")
#: Shown in place of a URL's user-info.
HIDDEN: Final = "***"
_LOCAL: Final = ("file", "local")


def is_url(location: object) -> bool:
    """Whether ``location`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(location, str) and _URL_RE.match(location) is not None


def redact(url: str) -> str:
    """``url`` as it may be shown: its user-info (``KEY:SECRET@``) replaced by ``***@``."""
    return redact_text(url)


def redact_text(text: str) -> str:
    """``text`` with the user-info of every URL in it replaced by ``***@``."""
    if "@" not in text:  # the common case costs one scan
        return text
    return _USERINFO_RE.sub(rf"\1{HIDDEN}@", text)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot hold a run's checkpoints (``None``: it can): credentials in it,
    no bucket or host, an in-memory store nothing could resume from, a relative
    ``file://`` path. The message shows the URL redacted."""
    m = _URL_RE.match(url)
    if m is None:
        return None
    protocol, rest = m[1].lower(), url[m.end():]
    shown = redact(url)
    if redact(url) != url:
        return (f"{shown!r} holds credentials, which would be printed and stored: give "
                "them in storage_options or the environment (AWS_ACCESS_KEY_ID, "
                "GOOGLE_APPLICATION_CREDENTIALS)")
    if protocol == "memory":
        return (f"{shown!r} is in this process's memory: its checkpoints are gone when "
                "the run ends and nothing could resume from them; give a folder or an "
                "object store URL")
    if protocol in _LOCAL:
        if not rest.startswith("/"):
            return (f"{shown!r} is a relative file:// URL, which would resolve against the "
                    "current directory; give an absolute one (file:///data/ck) or a plain "
                    "path")
        return None
    if not rest.split("/", 1)[0]:
        return (f"{shown!r} names no bucket or host; give one, e.g. "
                f"'{protocol}://bucket/runs/lm/checkpoints'")
    return None


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
