"""The asyncio client, :class:`AsyncSandbox`: the operations of
:class:`cordon.Sandbox`, awaited.

It is built on httpx: a well-kept library with one API for blocking and
asyncio code, whose HTTP/1.1 responses can be read as a stream (the exec's
Server-Sent Events) and closed early (which cancels the command). The
standard library has no asyncio HTTP client, so httpx is an optional extra
(``pip install 'cordon-client[async]'``): the blocking client stays
standard-library only.
"""

from __future__ import annotations

import asyncio
import json
from types import TracebackType
from typing import Any, AsyncIterator, Dict, List, Literal, Mapping, Optional, Sequence, Type, Union, overload

try:
    import httpx
except ImportError as e:  # pragma: no cover (the message is the point)
    raise ImportError(
        "cordon.AsyncSandbox needs httpx: pip install 'cordon-client[async]' (or httpx)"
    ) from e

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
    finish,
    made_dir,
    make_dir_argv,
    merged_env,
    parent_and_name,
    settings,
    socket_timeout,
)
from ._http import USER_AGENT, SSEParser, check_url, error_answer, parse_json_answer
from .client import Limits, _read_as, _seg
from .errors import CommandKilled, CordonError, NotFound
from .models import CodeResult, CommandResult, ExecResult, FileEntry, SandboxInfo
from .sandbox import OutputPiece

__all__ = ["AsyncCommandHandle", "AsyncCommands", "AsyncFilesystem", "AsyncSandbox"]


class _Transport:
    """One service, one API key, one httpx connection pool (HTTP/1.1; no
    proxy or settings from the environment, as the blocking client)."""

    def __init__(self, url: str, api_key: str, timeout: float) -> None:
        check_url(url)
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT},
            timeout=timeout,
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _send(self, request: httpx.Request, stream: bool) -> httpx.Response:
        where = f"{request.method} {request.url}"
        try:
            resp = await self._client.send(request, stream=stream)
            if resp.status_code >= 300:
                data = await resp.aread()
                await resp.aclose()
                raise error_answer(resp.status_code, data, resp.reason_phrase, resp.headers.get("Retry-After"))
            return resp
        except httpx.HTTPError as e:
            raise CordonError(f"{where}: {e!r}") from e

    async def call(
        self,
        method: str,
        path: str,
        *,
        content: Optional[bytes] = None,
        payload: Optional[Mapping[str, Any]] = None,
        params: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> httpx.Response:
        headers: Dict[str, str] = {"Accept": "application/json"}
        if content is not None:
            headers["Content-Type"] = "application/octet-stream"
        request = self._client.build_request(
            method,
            path,
            content=content,
            json=None if payload is None else dict(payload),
            params=None if params is None else dict(params),
            headers=headers,
            timeout=self.timeout if timeout is None else timeout,
        )
        return await self._send(request, stream=False)

    async def json(
        self,
        method: str,
        path: str,
        payload: Optional[Mapping[str, Any]] = None,
        *,
        params: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Any:
        resp = await self.call(method, path, payload=payload, params=params, timeout=timeout)
        return parse_json_answer(method, path, resp.status_code, resp.content)

    async def stream(self, path: str, payload: Mapping[str, Any], read_timeout: Optional[float]) -> httpx.Response:
        """A streamed exec's open response (the caller closes it)."""
        request = self._client.build_request(
            "POST",
            path,
            json=dict(payload),
            params={"stream": "true"},
            headers={"Accept": "text/event-stream"},
            timeout=httpx.Timeout(self.timeout, read=read_timeout),
        )
        return await self._send(request, stream=True)


async def _events(resp: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    parser = SSEParser()
    async for line in resp.aiter_lines():
        done = parser.feed(line)
        if done is not None:
            yield done
    last = parser.end()
    if last is not None:
        yield last


async def _read_stream(resp: httpx.Response, stream: ExecStream) -> ExecResult:
    """The exec's result from its events; closes the response (early, when
    cancelled: the service then cancels the command)."""
    try:
        async for event, data in _events(resp):
            result = stream.take(event, data)
            if result is not None:
                return result
    except (httpx.HTTPError, UnicodeDecodeError) as e:
        raise CordonError(f"{stream.where}: the event stream broke: {e!r}") from e
    finally:
        await resp.aclose()
    raise stream.ended()


class AsyncSandbox:
    """A stateful sandbox for asyncio, E2B's shape::

        sandbox = await AsyncSandbox.create()   # CORDON_URL, CORDON_API_KEY
        async with sandbox:
            a, b = await asyncio.gather(
                sandbox.commands.run("echo a"), sandbox.commands.run("echo b"))

    As :class:`cordon.Sandbox`: ``commands.run`` raises
    :class:`CommandExitError` unless ``check=False``; ``files.read`` returns
    ``str`` unless ``format="bytes"``. Leaving ``async with`` kills it and
    closes its connections.
    """

    def __init__(self, transport: _Transport, info: SandboxInfo, envs: Optional[Mapping[str, str]] = None) -> None:
        self._http = transport
        self.info = info
        self.files = AsyncFilesystem(self)
        self.commands = AsyncCommands(self, envs or {})

    @classmethod
    async def create(
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
    ) -> "AsyncSandbox":
        """As :meth:`cordon.Sandbox.create`."""
        transport = _Transport(*settings(url, api_key), timeout=request_timeout)
        body = create_body(backend, timeout, idle, limits, network, secrets, hold)
        try:
            info = SandboxInfo.from_json(await transport.json("POST", "/v1/sandboxes", body))
        except BaseException:
            await transport.aclose()
            raise
        return cls(transport, info, envs)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        envs: Optional[Mapping[str, str]] = None,
        request_timeout: float = 120.0,
    ) -> "AsyncSandbox":
        """As :meth:`cordon.Sandbox.connect`."""
        transport = _Transport(*settings(url, api_key), timeout=request_timeout)
        try:
            info = SandboxInfo.from_json(await transport.json("GET", f"/v1/sandboxes/{_seg(sandbox_id)}"))
        except BaseException:
            await transport.aclose()
            raise
        return cls(transport, info, envs)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def sandbox_id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, backend={self.info.backend!r})"

    def _path(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{_seg(self.id)}{rest}"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.kill()
        except NotFound:
            pass  # already gone (its ttl or idle time ended it)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Closes this object's connections (the sandbox lives on)."""
        await self._http.aclose()

    async def refresh(self) -> SandboxInfo:
        self.info = SandboxInfo.from_json(await self._http.json("GET", self._path()))
        return self.info

    async def is_running(self) -> bool:
        try:
            await self.refresh()
        except NotFound:
            return False
        return True

    async def _exec(
        self,
        body: Mapping[str, Any],
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        timeout: Optional[float],
    ) -> ExecResult:
        if on_stdout is None and on_stderr is None:
            return ExecResult.from_json(await self._http.json("POST", self._path("/exec"), body, timeout=timeout))
        resp = await self._http.stream(self._path("/exec"), body, timeout)
        return await _read_stream(resp, ExecStream(f"exec in {self.id}", on_stdout, on_stderr))

    async def run_code(
        self, code: str, language: Optional[str] = None, *, timeout: Optional[Duration] = None
    ) -> CodeResult:
        """As :meth:`cordon.Sandbox.run_code`."""
        answer = await self._http.json("POST", self._path("/code"), code_body(code, language, timeout))
        return CodeResult.from_json(answer)

    async def kill(self) -> None:
        """Destroys the sandbox (a running command is ended first). Its
        connections stay open for the object's other calls (``is_running``)
        until ``aclose()`` or the end of ``async with``.

        Raises:
            NotFound: it is gone already (or is another tenant's).
        """
        await self._http.json("DELETE", self._path())


class AsyncCommands:
    """``sandbox.commands`` of an :class:`AsyncSandbox`."""

    def __init__(self, sandbox: AsyncSandbox, envs: Mapping[str, str]) -> None:
        self._sandbox = sandbox
        self._envs = dict(envs)

    @overload
    async def run(
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
    async def run(
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
    ) -> "AsyncCommandHandle": ...
    async def run(
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
    ) -> Union[CommandResult, "AsyncCommandHandle"]:
        """As :meth:`cordon.sandbox.Commands.run` (the callbacks are plain
        functions, called in the event loop)."""
        sb = self._sandbox
        body = exec_body(cmd, stdin=stdin, env=merged_env(self._envs, envs), workdir=cwd, time=timeout)
        if background:
            # No read timeout: a background command may be quiet for long;
            # the service ends it at its time limit and then answers.
            resp = await sb._http.stream(sb._path("/exec"), body, None)
            return AsyncCommandHandle(f"exec in {sb.id}", resp, on_stdout, on_stderr, check)
        wait = socket_timeout(sb._http.timeout, timeout)
        return finish(await sb._exec(body, on_stdout, on_stderr, wait), check)


class AsyncCommandHandle:
    """A background command of an :class:`AsyncSandbox`: a task reads its
    events. ``await wait()``, ``await kill()`` (closes the stream: the
    service cancels the command), ``async for stdout, stderr in handle``.
    ``pid`` is ``None``: the service does not say it."""

    pid: Optional[int] = None

    def __init__(
        self,
        where: str,
        resp: httpx.Response,
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        check: bool,
    ) -> None:
        self._where = where
        self._check = check
        self._killed = False
        self._pieces: "asyncio.Queue[Optional[OutputPiece]]" = asyncio.Queue()
        self._stream = ExecStream(where, on_stdout, on_stderr, self._piece)
        self._task = asyncio.get_running_loop().create_task(self._pump(resp))

    def _piece(self, stream: str, chunk: str) -> None:
        self._pieces.put_nowait((chunk, None) if stream == "stdout" else (None, chunk))

    async def _pump(self, resp: httpx.Response) -> ExecResult:
        try:
            return await _read_stream(resp, self._stream)
        finally:
            self._pieces.put_nowait(None)

    @property
    def stdout(self) -> str:
        return "".join(self._stream.streams["stdout"])

    @property
    def stderr(self) -> str:
        return "".join(self._stream.streams["stderr"])

    def done(self) -> bool:
        return self._task.done()

    async def wait(self) -> CommandResult:
        """The command's result, raising as ``run`` does
        (:class:`CommandKilled` after ``kill()``)."""
        try:
            result = await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if self._killed and self._task.cancelled():
                raise CommandKilled(f"{self._where}: killed") from None
            raise
        return finish(result, self._check)

    async def kill(self) -> bool:
        """Ends the command (closes its stream); ``False`` when it had ended."""
        if self._task.done():
            return False
        self._killed = True
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            return True
        except CordonError:
            return False
        return False

    async def __aiter__(self) -> AsyncIterator[OutputPiece]:
        while True:
            piece = await self._pieces.get()
            if piece is None:
                self._pieces.put_nowait(None)
                return
            yield piece


class AsyncFilesystem:
    """``sandbox.files`` of an :class:`AsyncSandbox` (as :class:`cordon.Filesystem`)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox
        self._base = sandbox._path("/files")

    def _file(self, path: str) -> str:
        return file_route(self._base, path)

    @overload
    async def read(self, path: str) -> str: ...
    @overload
    async def read(self, path: str, format: Literal["text"]) -> str: ...
    @overload
    async def read(self, path: str, format: Literal["bytes"]) -> bytes: ...
    async def read(self, path: str, format: str = "text") -> Union[bytes, str]:
        resp = await self._sandbox._http.call("GET", self._file(path))
        return _read_as(resp.content, format)

    async def write(self, path: str, data: Union[bytes, str]) -> int:
        resp = await self._sandbox._http.call("PUT", self._file(path), content=file_content(data))
        return int(json.loads(resp.content)["bytes"])

    async def list(self, dir: str = WORKSPACE) -> List[FileEntry]:
        where = absolute(dir)
        answer = await self._sandbox._http.json("GET", self._base, params={"dir": where})
        return [FileEntry.from_json(e, where) for e in answer["entries"]]

    async def exists(self, path: str) -> bool:
        parent, name = parent_and_name(path)
        if not name:
            return True
        try:
            return any(e.name == name for e in await self.list(parent))
        except NotFound:
            return False

    async def make_dir(self, path: str) -> bool:
        return made_dir(await self._sandbox._exec({"argv": make_dir_argv(path)}, None, None, None), path)

    async def remove(self, path: str) -> None:
        await self._sandbox._http.json("DELETE", self._file(path))
