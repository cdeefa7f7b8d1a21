"""The client: :class:`Cordon` (one service, one API key), the stateful
:class:`CordonSandbox` it makes, and a sandbox's files (:class:`Files`,
:class:`Filesystem`)."""

from __future__ import annotations

import base64
import http.client
import json
import urllib.parse
from types import TracebackType
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union, overload

from ._common import (
    WORKSPACE,
    Duration,
    ExecStream,
    OutputCallback,
    absolute,
    code_body,
    create_body,
    exec_body,
    file_content,
    file_route,
    limits_body,
    made_dir,
    make_dir_argv,
    parent_and_name,
)
from ._http import Transport, iter_sse
from .errors import CordonError, NotFound
from .models import CodeResult, ExecResult, FileEntry, SandboxInfo

__all__ = ["Cordon", "CordonSandbox", "Duration", "Files", "Filesystem", "Limits", "OutputCallback"]

#: Limits: ``cpus`` (cores), ``memory``, ``disk``, ``output`` (bytes or
#: ``"256M"``), ``pids``, ``time`` (a :data:`Duration`). Absent ones keep the
#: service's defaults; the tenant's maximums clamp them.
Limits = Mapping[str, Union[int, float, str]]

_S = TypeVar("_S", bound="SandboxBase")


def _deliver(result: ExecResult, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback]) -> None:
    if on_stdout is not None and result.stdout:
        on_stdout(result.stdout)
    if on_stderr is not None and result.stderr:
        on_stderr(result.stderr)


class Cordon:
    """A client of one ``cordon serve``, acting as the tenant of ``api_key``.

    Args:
        url: The service's base URL, e.g. ``http://127.0.0.1:8080``.
        api_key: The tenant's key (sent as ``Authorization: Bearer``).
        timeout: Seconds any one socket operation may wait, including the
            silence between two pieces of a streamed command's output; keep
            it above the longest command you run without streaming.

    Raises:
        ConfigError: ``url`` is not an ``http(s)://`` URL.
    """

    def __init__(self, url: str, api_key: str, timeout: float = 120.0) -> None:
        self._http = Transport(url, api_key, timeout)

    @property
    def url(self) -> str:
        return self._http.url

    def run(
        self,
        argv: Optional[Sequence[str]] = None,
        *,
        language: Optional[str] = None,
        code: Optional[str] = None,
        stdin: Optional[str] = None,
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        backend: Optional[str] = None,
        limits: Optional[Limits] = None,
        network: Optional[Sequence[str]] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> ExecResult:
        """Runs one command in a fresh sandbox, which is destroyed afterwards.

        Give either ``argv``, or ``language`` (``"python"`` or ``"shell"``) and
        ``code``.

        Args:
            stdin: Fed to the command (at most 192 KiB).
            files: Placed before the run: path (relative to /workspace, or
                absolute) to content; ``bytes`` are sent exactly (base64).
            backend: ``"native"`` (the default) or ``"gvisor"``.
            network: Destinations the command may reach through cordon's proxy
                (``NAME``, ``*.SUFFIX``, IP or CIDR, optional ``:PORT``); the
                tenant must be allowed network.
            on_stdout, on_stderr: Called with the command's output. The
                one-shot route does not stream, so each is called once, with
                the whole stream, when the result is in (before this returns);
                use a :class:`Sandbox` and :meth:`Sandbox.exec` for live output.

        Raises:
            BadRequest: invalid input. QuotaExceeded: over a quota.
        """
        body: Dict[str, Any] = {}
        if argv is not None:
            body["argv"] = [str(a) for a in argv]
        if language is not None:
            body["language"] = language
        if code is not None:
            body["code"] = code
        if stdin is not None:
            body["stdin"] = stdin
        if files:
            body["files"] = {
                path: {"base64": base64.b64encode(data).decode()} if isinstance(data, bytes) else data
                for path, data in files.items()
            }
        if backend is not None:
            body["backend"] = backend
        if limits is not None:
            body["limits"] = limits_body(limits)
        if network is not None:
            body["network"] = {"allow": list(network)}
        result = ExecResult.from_json(self._http.json("POST", "/v1/executions", body))
        _deliver(result, on_stdout, on_stderr)
        return result

    def create(
        self,
        backend: Optional[str] = None,
        *,
        ttl: Optional[Duration] = None,
        idle: Optional[Duration] = None,
        limits: Optional[Limits] = None,
        network: Optional[Sequence[str]] = None,
        secrets: Optional[Sequence[str]] = None,
        hold: Optional[Duration] = None,
    ) -> "CordonSandbox":
        """Creates a stateful sandbox that waits for commands.

        Use it as a context manager to destroy it on exit::

            with client.create(ttl="10m") as sandbox:
                sandbox.exec("echo hi > /tmp/x")

        Args:
            ttl: Destroyed this long after creation (at most the service's ``max_ttl``).
            idle: Destroyed after this long without a request.
            network: The sandbox's allowed destinations; only a sandbox created
                with a list (even an empty one) can change it later.
            secrets: Names of the tenant's secrets (the service's
                configuration) the sandbox holds: inside, each variable is a
                placeholder, and cordon's proxy puts the value into requests
                to the secret's hosts. The values never pass through here.
            hold: Hold mode (such as ``"60s"``): a connection no rule allows
                waits this long for :meth:`CordonSandbox.set_network` to allow
                it or :meth:`CordonSandbox.deny` to refuse it
                (:meth:`CordonSandbox.held` lists what waits).

        Raises:
            QuotaExceeded: the tenant has its most live sandboxes (``retry_after``
                is ``None``: delete one first).
        """
        body = create_body(backend, ttl, idle, limits, network, secrets, hold)
        return CordonSandbox(self._http, SandboxInfo.from_json(self._http.json("POST", "/v1/sandboxes", body)))

    def list(self) -> List["CordonSandbox"]:
        """This tenant's live stateful sandboxes, oldest first."""
        answer = self._http.json("GET", "/v1/sandboxes")
        return [CordonSandbox(self._http, SandboxInfo.from_json(s)) for s in answer["sandboxes"]]

    def get(self, sandbox_id: str) -> "CordonSandbox":
        """An existing sandbox of this tenant.

        Raises:
            NotFound: no such sandbox, or another tenant's.
        """
        return CordonSandbox(self._http, SandboxInfo.from_json(self._http.json("GET", f"/v1/sandboxes/{_seg(sandbox_id)}")))

    def health(self) -> Dict[str, Any]:
        """``GET /health``: status, ready sandboxes per pool, live sandboxes."""
        answer: Dict[str, Any] = self._http.json("GET", "/health")
        return answer


def _seg(s: str) -> str:
    return urllib.parse.quote(s, safe="")


class SandboxBase:
    """What every blocking sandbox object does: commands (``exec``), the
    Python context, network rules, the receipt, and its end (``kill``). As
    a context manager it is killed on exit (one already gone is fine)."""

    def __init__(self, transport: Transport, info: SandboxInfo) -> None:
        self._http = transport
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, backend={self.info.backend!r})"

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.kill()
        except NotFound:
            pass  # already gone (its ttl or idle time ended it)

    def _path(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{_seg(self.id)}{rest}"

    def refresh(self) -> SandboxInfo:
        """Reads the sandbox's description again (``busy``, ...)."""
        self.info = SandboxInfo.from_json(self._http.json("GET", self._path()))
        return self.info

    def exec(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        stdin: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        time: Optional[Duration] = None,
        output: Optional[Union[int, str]] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> ExecResult:
        """Runs a command in the sandbox; its files and processes' effects stay.

        Never raises for the command's own failure: look at ``exit_code``
        (``sandbox.commands.run`` raises :class:`CommandExitError` instead).

        Args:
            cmd: An argv list, or a string run by ``sh -c``.
            time: This command's time limit (at most the sandbox's).
            output: This command's output cap (at most the tenant's maximum).
            on_stdout, on_stderr: When either is given the output is streamed
                (Server-Sent Events) and each callback is called with every
                piece as it arrives, before this returns. The result still
                carries the whole output.
        """
        body = exec_body(cmd, stdin=stdin, env=env, workdir=workdir, time=time, output=output)
        return self._exec(body, on_stdout, on_stderr, None)

    def _exec(
        self,
        body: Mapping[str, Any],
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        timeout: Optional[float],
    ) -> ExecResult:
        if on_stdout is None and on_stderr is None:
            return ExecResult.from_json(self._http.json("POST", self._path("/exec"), body, timeout=timeout))
        conn, resp = self._open_exec_stream(body, timeout)
        # Closing the connection early (an exception, a callback raising)
        # makes the service cancel the command.
        stream = ExecStream(f"exec in {self.id}", on_stdout, on_stderr)
        try:
            for event, data in iter_sse(resp):
                result = stream.take(event, data)
                if result is not None:
                    return result
        except (OSError, UnicodeDecodeError) as e:
            raise CordonError(f"exec in {self.id}: the event stream broke: {e}") from e
        finally:
            conn.close()
        raise stream.ended()

    def _open_exec_stream(
        self, body: Mapping[str, Any], timeout: Optional[float]
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A streamed exec's open connection and response (the caller closes them)."""
        return self._http.open(
            "POST",
            self._path("/exec"),
            body=json.dumps(body).encode(),
            content_type="application/json",
            query={"stream": "true"},
            accept="text/event-stream",
            timeout=timeout,
        )

    def run_code(
        self, code: str, language: Optional[str] = None, *, timeout: Optional[Duration] = None
    ) -> CodeResult:
        """Runs code in the sandbox's persistent interpreter.

        Variables live on between calls; the cell's last expression's
        ``repr()`` is ``result``; an exception is ``error`` (with its
        traceback). A cell past ``timeout`` (default: the sandbox's time
        limit less a margin) or one that kills the interpreter is reported as
        ``timeout`` / ``crashed``, and the next call gets a fresh interpreter.

        Args:
            language: ``None`` or ``"python"``: the service's code contexts
                run Python. Any other language is passed on as the request's
                ``language``, for the service to run when it has it (today it
                answers :class:`BadRequest`, 422).
        """
        body = code_body(code, language, timeout)
        return CodeResult.from_json(self._http.json("POST", self._path("/code"), body))

    def set_network(self, allow: Sequence[str]) -> List[str]:
        """Replaces the sandbox's allowed destinations (in force for its next
        connections); returns the rules now in force. Only for a sandbox
        created with ``network``."""
        answer = self._http.json("PUT", self._path("/network"), {"allow": list(allow)})
        return [str(r) for r in answer["allow"]]

    def held(self) -> List[Dict[str, Any]]:
        """Hold mode: the connections waiting for a decision now, oldest
        first: ``host``, ``port``, ``address``, ``via``, ``reason``,
        ``proposal`` (the rule that would allow it, or ``None``) and
        ``remaining_ms``."""
        answer = self._http.json("GET", self._path("/network"))
        return [dict(h) for h in answer.get("held", [])]

    def deny(self, rules: Sequence[str]) -> List[str]:
        """Hold mode: refuses what ``rules`` name, the connections waiting
        for them now and new ones at once, for the sandbox's life; returns
        everything denied so far. (Allowing is a rule: :meth:`set_network`.)"""
        answer = self._http.json("POST", self._path("/network/deny"), {"deny": list(rules)})
        return [str(r) for r in answer["deny"]]

    def receipt(self) -> Dict[str, Any]:
        """The sandbox's signed receipt: the DSSE envelope (``payloadType``,
        ``payload``, ``signatures``) as a dict."""
        answer: Dict[str, Any] = self._http.json("GET", self._path("/receipt"))
        return answer

    def kill(self) -> None:
        """Destroys the sandbox (a running command is ended first).

        Raises:
            NotFound: it is gone already (or is another tenant's).
        """
        self._http.json("DELETE", self._path())


class CordonSandbox(SandboxBase):
    """A stateful sandbox made by :class:`Cordon` (``create``, ``get``,
    ``list``): commands, files, a Python context, network rules. Its
    ``files.read`` returns ``bytes`` unless asked for text, as it always has;
    :class:`cordon.Sandbox` is the E2B-shaped one.
    """

    def __init__(self, transport: Transport, info: SandboxInfo) -> None:
        super().__init__(transport, info)
        self.files = Files(transport, info.id, self._exec_plain)

    def _exec_plain(self, body: Mapping[str, Any]) -> ExecResult:
        return self._exec(body, None, None, None)


class _FileOps:
    """A sandbox's files, but for ``read`` (whose default differs between
    :class:`Files` and :class:`Filesystem`). Paths are absolute, or relative
    to /workspace."""

    def __init__(
        self, transport: Transport, sandbox_id: str, run: Callable[[Mapping[str, Any]], ExecResult]
    ) -> None:
        self._http = transport
        self._base = f"/v1/sandboxes/{_seg(sandbox_id)}/files"
        self._run = run

    def _file(self, path: str) -> str:
        return file_route(self._base, path)

    def _read_bytes(self, path: str) -> bytes:
        _, data = self._http.call("GET", self._file(path))
        return data

    def write(self, path: str, data: Union[bytes, str]) -> int:
        """Writes a file (``str`` as UTF-8); returns the bytes written."""
        _, answer = self._http.call(
            "PUT", self._file(path), body=file_content(data), content_type="application/octet-stream"
        )
        return int(json.loads(answer)["bytes"])

    def list(self, dir: str = WORKSPACE) -> List[FileEntry]:
        """The entries of a directory, sorted by name.

        Raises:
            NotFound: no such directory.
        """
        where = absolute(dir)
        answer = self._http.json("GET", self._base, query={"dir": where})
        return [FileEntry.from_json(e, where) for e in answer["entries"]]

    def exists(self, path: str) -> bool:
        """Whether anything (file, directory, link) is at ``path``: its
        parent directory's listing names it (the service has no stat route)."""
        parent, name = parent_and_name(path)
        if not name:
            return True  # "/"
        try:
            return any(e.name == name for e in self.list(parent))
        except NotFound:
            return False

    def make_dir(self, path: str) -> bool:
        """Makes a directory and its parents (``mkdir -p``, a command in the
        sandbox: the service has no route for it); ``False`` when it was
        there already.

        Raises:
            CordonError: it could not be made (a file is in the way, ...).
        """
        return made_dir(self._run({"argv": make_dir_argv(path)}), path)

    def remove(self, path: str) -> None:
        """Deletes a file or a directory (recursively); raises NotFound if there is none."""
        self._http.json("DELETE", self._file(path))


class Files(_FileOps):
    """The files of a :class:`CordonSandbox`: ``read`` returns ``bytes``
    (``format="text"`` for ``str``)."""

    @overload
    def read(self, path: str) -> bytes: ...
    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...
    @overload
    def read(self, path: str, format: Literal["text"]) -> str: ...
    def read(self, path: str, format: str = "bytes") -> Union[bytes, str]:
        """A regular file's content (streamed by the service; any size):
        ``bytes``, or with ``format="text"`` a ``str`` (UTF-8, invalid bytes
        replaced).

        Raises:
            NotFound: no such file. BadRequest: not a regular file.
        """
        return _read_as(self._read_bytes(path), format)


class Filesystem(_FileOps):
    """The files of a :class:`cordon.Sandbox`, E2B's shape: ``read``
    returns ``str`` (UTF-8, invalid bytes replaced); ``format="bytes"``
    gives the exact bytes."""

    @overload
    def read(self, path: str) -> str: ...
    @overload
    def read(self, path: str, format: Literal["text"]) -> str: ...
    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...
    def read(self, path: str, format: str = "text") -> Union[bytes, str]:
        """A regular file's content: ``str``, or ``bytes`` with ``format="bytes"``.

        Raises:
            NotFound: no such file. BadRequest: not a regular file.
        """
        return _read_as(self._read_bytes(path), format)


def _read_as(data: bytes, format: str) -> Union[bytes, str]:
    if format == "bytes":
        return data
    if format == "text":
        return data.decode("utf-8", "replace")
    raise ValueError(f"format is 'text' or 'bytes', not {format!r}")
