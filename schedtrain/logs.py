"""The library's loggers: structlog's, made (and structlog imported) at a logger's first use.

structlog and what it pulls in (rich, asyncio) take a tenth of a second to import: a
module that logs only on rare paths (a warning, a debug line the CLI asks for) should
not make every process that imports it pay that. Only an application configures
structlog (the CLI does, ``cli.main``); the library never does.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["Logger", "get_logger", "is_configured"]


class Logger:
    """``structlog.get_logger(name)``, looked up when first called: ``_log.warning(...)``
    and every other method behave as structlog's own logger's."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, method: str) -> Any:
        if self._logger is None:
            import structlog

            # structlog's lazy proxy: it reads the configuration at each call, as before.
            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, method)


def get_logger(name: str) -> Logger:
    """The logger the library's modules keep at module level, named ``name``."""
    return Logger(name)


def is_configured() -> bool:
    """Whether an application configured structlog (it must have imported it to do so)."""
    structlog = sys.modules.get("structlog")
    return structlog is not None and bool(structlog.is_configured())
