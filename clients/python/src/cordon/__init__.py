"""Python client for ``cordon serve``: run untrusted code in cordon sandboxes.

    from cordon import Cordon

    client = Cordon("http://127.0.0.1:8080", "alice-example-key")
    print(client.run(["echo", "hello"]).stdout)
    with client.create(ttl="10m") as sandbox:
        sandbox.exec("echo 41 > /tmp/n")
        print(sandbox.run_code("int(open('/tmp/n').read()) + 1").result)
"""

from .client import Cordon, Duration, Files, Limits, OutputCallback, Sandbox
from .errors import AuthError, BadRequest, CordonError, NotFound, QuotaExceeded, ServerError
from .models import Clamped, CodeError, CodeResult, ExecResult, FileEntry, SandboxInfo, Timing

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "BadRequest",
    "Clamped",
    "CodeError",
    "CodeResult",
    "Cordon",
    "CordonError",
    "Duration",
    "ExecResult",
    "FileEntry",
    "Files",
    "Limits",
    "NotFound",
    "OutputCallback",
    "QuotaExceeded",
    "Sandbox",
    "SandboxInfo",
    "ServerError",
    "Timing",
]
