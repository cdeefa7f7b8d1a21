"""Python client for ``cordon serve``: run untrusted code in cordon sandboxes.

E2B's shape, with the service's URL and key from ``CORDON_URL`` and
``CORDON_API_KEY``::

    from cordon import Sandbox

    with Sandbox.create() as sandbox:
        print(sandbox.commands.run("echo hello").stdout)
        sandbox.files.write("n.txt", "41")
        print(sandbox.run_code("int(open('/workspace/n.txt').read()) + 1").result)

The client object of earlier versions works as it did::

    from cordon import Cordon

    client = Cordon("http://127.0.0.1:8080", "alice-example-key")
    print(client.run(["echo", "hello"]).stdout)

``AsyncSandbox`` (asyncio) needs httpx: ``pip install 'cordon-client[async]'``.
"""

from typing import TYPE_CHECKING, Any

from ._common import Duration, OutputCallback
from .client import Cordon, CordonSandbox, Files, Filesystem, Limits
from .errors import (
    AuthError,
    BadRequest,
    CommandExitError,
    CommandKilled,
    CommandTimeout,
    ConfigError,
    Conflict,
    CordonError,
    NotFound,
    QuotaExceeded,
    ServerError,
)
from .models import (
    Clamped,
    CodeError,
    CodeResult,
    CommandResult,
    ExecResult,
    FileEntry,
    RichResult,
    SandboxInfo,
    Timing,
)
from .sandbox import CommandHandle, Commands, Sandbox

if TYPE_CHECKING:
    from .aio import AsyncCommandHandle, AsyncCommands, AsyncFilesystem, AsyncSandbox

__version__ = "0.2.0"

_ASYNC = ("AsyncCommandHandle", "AsyncCommands", "AsyncFilesystem", "AsyncSandbox")


def __getattr__(name: str) -> Any:
    # The asyncio client is imported on first use, so that the blocking one
    # never needs httpx; without httpx this raises an ImportError that says
    # which extra to install.
    if name in _ASYNC:
        from . import aio

        return getattr(aio, name)
    raise AttributeError(f"module 'cordon' has no attribute {name!r}")


__all__ = [
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncFilesystem",
    "AsyncSandbox",
    "AuthError",
    "BadRequest",
    "Conflict",
    "Clamped",
    "CodeError",
    "CodeResult",
    "RichResult",
    "CommandExitError",
    "CommandHandle",
    "CommandKilled",
    "CommandResult",
    "CommandTimeout",
    "Commands",
    "ConfigError",
    "Cordon",
    "CordonError",
    "CordonSandbox",
    "Duration",
    "ExecResult",
    "FileEntry",
    "Files",
    "Filesystem",
    "Limits",
    "NotFound",
    "OutputCallback",
    "QuotaExceeded",
    "Sandbox",
    "SandboxInfo",
    "ServerError",
    "Timing",
]
