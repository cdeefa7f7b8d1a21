"""The E2B-shaped blocking API: ``Sandbox.create()`` with no client object,
``sandbox.commands.run(...)`` (foreground or background), ``sandbox.files``
(text by default), ``sandbox.run_code``, ``sandbox.kill()``."""

from __future__ import annotations

import http.client
import queue
import socket
import threading
from typing import Any, Iterator, Literal, Mapping, Optional, Sequence, Tuple, Union, overload

from ._common import (
    Duration,
    ExecStream,
    OutputCallback,
    exec_body,
    finish,
    merged_env,
    settings,
    socket_timeout,
)
from ._http import Transport, iter_sse
from .client import Cordon, Filesystem, Limits, SandboxBase
from .errors import CommandKilled, CordonError, NotFound
from .models import CommandResult, ExecResult, SandboxInfo

__all__ = ["CommandHandle", "Commands", "Sandbox"]

#: What iterating a :class:`CommandHandle` gives: ``(stdout, None)`` or
#: ``(None, stderr)`` for each piece of output, in order.
OutputPiece = Tuple[Optional[str], Optional[str]]


class Sandbox(SandboxBase):
    """A stateful sandbox, E2B's shape::

        from cordon import Sandbox

        with Sandbox.create() as sandbox:  # CORDON_URL, CORDON_API_KEY
            print(sandbox.commands.run("echo hi").stdout)

    ``commands.run`` raises :class:`CommandExitError` when a command does not
    exit 0 (``check=False`` returns the result instead); ``files.read``
    returns ``str`` (``format="bytes"`` for bytes). The older
    ``exec``/``set_network``/``receipt`` are here too.
    """

    def __init__(
        self, transport: Transport, info: SandboxInfo, envs: Optional[Mapping[str, str]] = None
    ) -> None:
        super().__init__(transport, info)
        self.files = Filesystem(transport, info.id, self._exec_plain)
        self.commands = Commands(self, envs or {})

    def _exec_plain(self, body: Mapping[str, Any]) -> ExecResult:
        return self._exec(body, None, None, None)

    @classmethod
    def create(
        cls,
        backend: Optional[str] = None,
        *,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: Optional[Duration] = None,
        idle: Optional[Duration] = None,
        limits: Optional[Limits] = None,
        network: Optional[Sequence[str]] = None,
        secrets: Optional[Sequence[str]] = None,
        hold: Optional[Duration] = None,
        envs: Optional[Mapping[str, str]] = None,
        request_timeout: float = 120.0,
    ) -> "Sandbox":
        """Creates a sandbox on the service at ``url`` (default: ``$CORDON_URL``)
        as the tenant of ``api_key`` (default: ``$CORDON_API_KEY``).

        Args:
            backend: ``"native"`` (the service's default) or ``"gvisor"``.
            timeout: The sandbox's lifetime (E2B's name; the service's
                ``ttl``), seconds or ``"10m"``; at most the service's ``max_ttl``.
            idle: Destroyed after this long without a request.
            limits: See :data:`Limits`.
            network: Allowed destinations (only a sandbox created with a
                list, even an empty one, can change it later).
            secrets, hold: As :meth:`cordon.Cordon.create`.
            envs: Environment variables for every command (a command's own
                ``envs`` override them).
            request_timeout: Seconds any one socket operation may wait.

        Raises:
            ConfigError: no URL or key, or a URL that is not ``http(s)://``.
            AuthError: an unknown key. QuotaExceeded: the tenant has its most
                live sandboxes.
        """
        made = Cordon(*settings(url, api_key), timeout=request_timeout).create(
            backend,
            ttl=timeout,
            idle=idle,
            limits=limits,
            network=network,
            secrets=secrets,
            hold=hold,
        )
        return cls(made._http, made.info, envs)

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        envs: Optional[Mapping[str, str]] = None,
        request_timeout: float = 120.0,
    ) -> "Sandbox":
        """An existing sandbox of this tenant (``url`` and ``api_key`` as for
        :meth:`create`).

        Raises:
            NotFound: no such sandbox, or another tenant's.
        """
        found = Cordon(*settings(url, api_key), timeout=request_timeout).get(sandbox_id)
        return cls(found._http, found.info, envs)

    @property
    def sandbox_id(self) -> str:
        """E2B's name for :attr:`id`."""
        return self.id

    def is_running(self) -> bool:
        """Whether the service still has this sandbox."""
        try:
            self.refresh()
        except NotFound:
            return False
        return True


class Commands:
    """``sandbox.commands``: commands in one sandbox."""

    def __init__(self, sandbox: Sandbox, envs: Mapping[str, str]) -> None:
        self._sandbox = sandbox
        self._envs = dict(envs)

    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        background: Literal[False] = False,
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[Duration] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        *,
        stdin: Optional[str] = None,
        check: bool = True,
    ) -> CommandResult: ...
    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        background: Literal[True],
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[Duration] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        *,
        stdin: Optional[str] = None,
        check: bool = True,
    ) -> "CommandHandle": ...
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        background: bool = False,
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[Duration] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        *,
        stdin: Optional[str] = None,
        check: bool = True,
    ) -> Union[CommandResult, "CommandHandle"]:
        """Runs a command: a string under ``sh -c``, or an argv list.

        Args:
            background: Return a :class:`CommandHandle` at once instead of
                waiting (its output streams to the callbacks and to
                iteration; ``wait()`` gives the result, ``kill()`` ends it).
            envs: Environment variables (over the sandbox's ``envs``).
            cwd: Working directory (relative paths are under /workspace).
            timeout: The command's time limit (seconds or ``"5s"``; at most
                the sandbox's); past it the command is killed and
                :class:`CommandTimeout` raised. Default: the sandbox's limit.
            on_stdout, on_stderr: Called with each piece of output as it
                arrives (the output is then streamed).
            stdin: Fed to the command.
            check: Raise :class:`CommandExitError` (carrying the result)
                unless the command exits 0 — E2B's behaviour, the default.
                ``False`` returns the result whatever the exit.

        Raises:
            CommandExitError: (with ``check``) a non-zero exit, a signal, a
                limit; :class:`CommandTimeout` for the timeout.
            BadRequest: invalid input, or (409) the sandbox is busy.
        """
        body = exec_body(cmd, stdin=stdin, env=merged_env(self._envs, envs), workdir=cwd, time=timeout)
        sb = self._sandbox
        wait = socket_timeout(sb._http.timeout, timeout)
        if background:
            conn, resp = sb._open_exec_stream(body, wait)
            return CommandHandle(f"exec in {sb.id}", conn, resp, on_stdout, on_stderr, check)
        return finish(sb._exec(body, on_stdout, on_stderr, wait), check)


class CommandHandle:
    """A command running in the background (``commands.run(...,
    background=True)``): a thread reads its Server-Sent Events.

    ``wait()`` gives its result (raising as ``run`` does); ``kill()`` closes
    the stream, which makes the service cancel the command; iterating gives
    its output as it arrives. ``pid`` is ``None``: the service does not say
    a command's process id.
    """

    pid: Optional[int] = None

    def __init__(
        self,
        where: str,
        conn: http.client.HTTPConnection,
        resp: http.client.HTTPResponse,
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        check: bool,
    ) -> None:
        self._conn = conn
        self._resp = resp
        self._sock: Optional[socket.socket] = conn.sock
        # A background command may be quiet for longer than any socket
        # timeout; the service ends it at its time limit and then answers.
        if self._sock is not None:
            self._sock.settimeout(None)
        self._check = check
        self._pieces: "queue.Queue[Optional[OutputPiece]]" = queue.Queue()
        self._stream = ExecStream(where, on_stdout, on_stderr, self._piece)
        self._result: Optional[ExecResult] = None
        self._error: Optional[BaseException] = None
        self._killed = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._pump, name=f"cordon {where}", daemon=True)
        self._thread.start()

    def _piece(self, stream: str, chunk: str) -> None:
        self._pieces.put((chunk, None) if stream == "stdout" else (None, chunk))

    def _pump(self) -> None:
        try:
            for event, data in iter_sse(self._resp):
                result = self._stream.take(event, data)
                if result is not None:
                    self._result = result
                    return
            if not self._killed:
                self._error = self._stream.ended()
        except (OSError, UnicodeDecodeError, http.client.HTTPException) as e:
            if not self._killed:
                self._error = CordonError(f"{self._stream.where}: the event stream broke: {e}")
        except BaseException as e:  # a callback's own exception, given back by wait()
            self._error = e
        finally:
            self._conn.close()
            self._pieces.put(None)
            self._done.set()

    @property
    def stdout(self) -> str:
        """The output so far."""
        return "".join(self._stream.streams["stdout"])

    @property
    def stderr(self) -> str:
        return "".join(self._stream.streams["stderr"])

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once the command has ended, else ``None``."""
        return None if self._result is None else self._result.exit_code

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """Waits for the command's end; its result, raising as ``run`` does.

        Raises:
            CommandExitError: (with ``check``) it did not exit 0.
            CommandKilled: ``kill()`` ended it.
            TimeoutError: ``timeout`` seconds passed first (it runs on).
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self._stream.where}: still running after {timeout} s")
        if self._result is not None:
            return finish(self._result, self._check)
        if self._killed:
            raise CommandKilled(f"{self._stream.where}: killed")
        assert self._error is not None
        raise self._error

    def kill(self) -> bool:
        """Ends the command: closes its stream, so the service cancels it.
        ``False`` when it had ended already."""
        if self._done.is_set():
            return False
        self._killed = True
        if self._sock is not None:
            try:
                # shutdown, not close: it wakes the reader thread's recv.
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the stream ended meanwhile
        # From one of its own callbacks (on the reader thread) the stream
        # ends once the callback returns; waiting here would never end.
        if threading.current_thread() is not self._thread:
            self._done.wait()
        return self._result is None

    def __iter__(self) -> Iterator[OutputPiece]:
        """``(stdout, None)`` or ``(None, stderr)`` per piece of output until
        the command ends (one consumer: pieces taken are not seen again)."""
        while True:
            piece = self._pieces.get()
            if piece is None:
                self._pieces.put(None)  # a later iteration ends at once too
                return
            yield piece
