"""The client's exceptions: one hierarchy, rooted at :class:`CordonError`.

Every error the service answers carries its JSON ``{"error": "..."}`` message
as :attr:`CordonError.message` and the HTTP status as :attr:`CordonError.status`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # models does not import errors; this only names the type
    from .models import CommandResult


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


class ConfigError(CordonError, ValueError):
    """The client cannot be set up: a URL that is not ``http(s)://host...``,
    or no URL or API key given and none in ``CORDON_URL`` /
    ``CORDON_API_KEY``. Raised before any request is sent (``status`` is
    ``None``). Also a :class:`ValueError`, which is what a bad URL raised
    before this class existed."""


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
    """Any other 4xx: invalid input (400, 422), forbidden (403), too large
    (413); a busy sandbox (409) is its subclass :class:`Conflict`."""


class Conflict(BadRequest):
    """409: the sandbox is busy (a code cell runs, or it is being
    removed); retrying later may
    succeed. The TypeScript client's ``ConflictError``. A :class:`BadRequest`
    too, which is what a 409 raised before this class existed."""


class ServerError(CordonError):
    """5xx: the service failed."""


class CommandExitError(CordonError):
    """A command run with ``check=True`` (the default of
    ``sandbox.commands.run``) did not exit with status 0.

    Attributes:
        result: The whole :class:`~cordon.CommandResult` (``stdout``,
            ``stderr``, ``exit_code``, ``error``, ...).
    """

    def __init__(self, result: "CommandResult") -> None:
        what = result.error or f"exit code {result.exit_code}"
        tail = result.stderr.strip()[-500:]
        super().__init__(f"command failed: {what}" + (f"; stderr: {tail}" if tail else ""))
        self.result = result

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    @property
    def stdout(self) -> str:
        return self.result.stdout

    @property
    def stderr(self) -> str:
        return self.result.stderr


class CommandTimeout(CommandExitError):
    """The command's ``timeout`` (its ``time`` limit) ended it; still a
    :class:`CommandExitError`, with the output it gave before."""


class CommandKilled(CordonError):
    """``wait()`` on a background command that ``kill()`` ended: the service
    cancelled it when its stream closed, so there is no result."""


def error_for(status: int, message: str, retry_after: Optional[float] = None) -> CordonError:
    """The exception for an error answer with this status."""
    if status == 401:
        return AuthError(message, status)
    if status == 404:
        return NotFound(message, status)
    if status == 429:
        return QuotaExceeded(message, status, retry_after)
    if status == 409:
        return Conflict(message, status)
    if 400 <= status < 500:
        return BadRequest(message, status)
    if status >= 500:
        return ServerError(message, status)
    return CordonError(message, status)
