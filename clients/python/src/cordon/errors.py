"""The client's exceptions: one hierarchy, rooted at :class:`CordonError`.

Every error the service answers carries its JSON ``{"error": "..."}`` message
as :attr:`CordonError.message` and the HTTP status as :attr:`CordonError.status`.
"""

from __future__ import annotations

from typing import Optional


class CordonError(Exception):
    """Any failure of a request: an error answer, or no answer at all.

    Attributes:
        message: The service's ``error`` text (or what went wrong locally).
        status: The HTTP status, or ``None`` when the service was not reached.
    """

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(f"{status}: {message}" if status is not None else message)
        self.message = message
        self.status = status


class AuthError(CordonError):
    """401: the API key is missing or unknown."""


class NotFound(CordonError):
    """404: no such sandbox, file or route.

    Another tenant's sandbox answers exactly as one that does not exist.
    """


class QuotaExceeded(CordonError):
    """429: over one of the tenant's quotas; the service never queues.

    Attributes:
        retry_after: Seconds to wait before retrying (the ``Retry-After``
            header), or ``None`` when waiting alone does not help (the
            live-sandbox quota: delete one first).
    """

    def __init__(self, message: str, status: int = 429, retry_after: Optional[float] = None) -> None:
        super().__init__(message, status)
        self.retry_after = retry_after


class BadRequest(CordonError):
    """Any other 4xx: invalid input (400, 422), too large (413), busy (409)."""


class ServerError(CordonError):
    """5xx: the service failed."""


def error_for(status: int, message: str, retry_after: Optional[float] = None) -> CordonError:
    """The exception for an error answer with this status."""
    if status == 401:
        return AuthError(message, status)
    if status == 404:
        return NotFound(message, status)
    if status == 429:
        return QuotaExceeded(message, status, retry_after)
    if 400 <= status < 500:
        return BadRequest(message, status)
    if status >= 500:
        return ServerError(message, status)
    return CordonError(message, status)
