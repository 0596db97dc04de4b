"""Which object-store failures are worth another try, and how a failure is named.

A store that refuses connections for a few seconds (restarting, a load balancer
failing over), resets them, answers 5xx or throttles (S3's ``SlowDown``) fails a request
now and serves the next one: ``FsspecStorage`` tries again, with backoff, until the
operation's deadline. A missing object, a refusal of access or a bad request is the
same at every try: it fails at once.
"""

from __future__ import annotations

import errno
from typing import Final

from schedtrain.urls import redact_text

__all__ = ["cause", "transient"]

#: Transient failures the clients raise as their own classes rather than ``OSError``:
#: botocore's connection errors (``EndpointConnectionError``: refused;
#: ``ConnectionClosedError``: reset; its connect and read timeouts) and aiohttp's (gcsfs).
#: Named, not imported: neither package is needed by a run without a URL.
_CLIENT_ERRORS: Final = frozenset({
    "botocore.exceptions.ConnectionError", "botocore.exceptions.HTTPClientError",
    "aiohttp.client_exceptions.ClientConnectionError",
    "aiohttp.client_exceptions.ClientPayloadError"})
#: Error codes a store answers when it is busy or failing for a while.
_BUSY_CODES: Final = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
    "TooManyRequests", "RequestTimeout", "InternalError", "ServiceUnavailable"})
_PERMANENT: Final = (FileNotFoundError, PermissionError, IsADirectoryError,
                     NotADirectoryError, FileExistsError)


def _busy_status(status: object) -> bool:
    return isinstance(status, int) and not isinstance(status, bool) and (
        status >= 500 or status == 429)


def transient(exc: BaseException) -> bool:
    """Worth another attempt: a refused, dropped or reset connection, a timeout, a
    server's 5xx or throttling (s3fs raises the last two as ``OSError``); a missing
    object or a refusal of access is not."""
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, OSError) and exc.errno == errno.EINVAL:
        return False  # a bad request (s3fs's 416 for a range of an empty object): as it is
    if isinstance(exc, OSError | ConnectionError | TimeoutError):
        return True
    if any(f"{c.__module__}.{c.__qualname__}" in _CLIENT_ERRORS for c in type(exc).__mro__):
        return True
    response = getattr(exc, "response", None)  # botocore's ClientError, untranslated
    if isinstance(response, dict):
        error, meta = response.get("Error"), response.get("ResponseMetadata")
        code = error.get("Code") if isinstance(error, dict) else None
        status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        return code in _BUSY_CODES or _busy_status(status)
    return _busy_status(getattr(exc, "code", None))  # gcsfs's HttpError


def cause(exc: BaseException, timeout: float | None = None) -> str:
    """``exc`` in a few words for a message: its class and first line, redacted."""
    text = redact_text((str(exc).strip().splitlines() or [""])[0][:200])
    if not text and timeout is not None and isinstance(exc, TimeoutError):
        text = f"no answer within {timeout:g} s"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
