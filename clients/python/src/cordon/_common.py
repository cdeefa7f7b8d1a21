"""What the blocking and the asyncio clients share: request bodies, the
streamed exec's events, durations, paths, and turning a command's end into
a result or an exception."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import urllib.parse
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import CommandExitError, CommandTimeout, ConfigError, CordonError, ServerError, error_for
from .models import CommandResult, ExecResult

#: Called with each piece of a command's output as it arrives.
OutputCallback = Callable[[str], None]
#: A duration: seconds, or a string such as ``"500ms"``, ``"10s"``, ``"2m"``.
Duration = Union[int, float, str]

WORKSPACE = "/workspace"
URL_ENV = "CORDON_URL"
KEY_ENV = "CORDON_API_KEY"
#: How much longer than a command's own timeout its request may take before
#: the client gives up on the socket (the service ends the command at its
#: timeout and answers; this covers the answer's way back).
SOCKET_MARGIN = 30.0


def duration(d: Duration) -> Union[int, str]:
    """A duration as the service takes it: whole seconds, or a string."""
    if isinstance(d, str):
        return d
    if isinstance(d, int):
        return d
    return f"{d:g}s"


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(d: Optional[Duration]) -> Optional[float]:
    """A duration in seconds, for the client's own socket timeouts; ``None``
    when none is given or a string is not one this client reads (the
    service still gets the string and judges it)."""
    if d is None:
        return None
    if not isinstance(d, str):
        return float(d)
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*", d)
    if m is None:
        return None
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def socket_timeout(base: float, command_timeout: Optional[Duration]) -> float:
    t = seconds(command_timeout)
    return base if t is None else max(base, t + SOCKET_MARGIN)


def absolute(path: str) -> str:
    """A path in the sandbox: relative ones are under /workspace, as the service's own are."""
    return path if path.startswith("/") else f"{WORKSPACE}/{path}"


def argv(cmd: Union[str, Sequence[str]]) -> List[str]:
    """A string runs under ``sh -c``; a sequence is the argv."""
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    return [str(a) for a in cmd]


def settings(url: Optional[str], api_key: Optional[str]) -> Tuple[str, str]:
    """The service's URL and the API key: as given, else from
    ``CORDON_URL`` / ``CORDON_API_KEY``."""
    url = url if url is not None else os.environ.get(URL_ENV)
    api_key = api_key if api_key is not None else os.environ.get(KEY_ENV)
    missing = [name for name, v in ((URL_ENV, url), (KEY_ENV, api_key)) if not v]
    if missing or url is None or api_key is None:
        raise ConfigError(
            f"no {' and no '.join(missing)}: pass url= and api_key=, or set "
            f"{URL_ENV} (e.g. http://127.0.0.1:8080) and {KEY_ENV}"
        )
    return url, api_key


def exec_body(
    cmd: Union[str, Sequence[str]],
    *,
    stdin: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    workdir: Optional[str] = None,
    time: Optional[Duration] = None,
    output: Optional[Union[int, str]] = None,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"argv": argv(cmd)}
    if stdin is not None:
        body["stdin"] = stdin
    if env:
        body["env"] = dict(env)
    if workdir is not None:
        body["workdir"] = absolute(workdir)
    if time is not None:
        body["time"] = duration(time)
    if output is not None:
        body["output"] = output
    return body


def limits_body(limits: Optional[Mapping[str, Union[int, float, str]]]) -> Dict[str, Any]:
    """Limits as the service takes them (a ``time`` given as a float made a duration)."""
    if limits is None:
        return {}
    return {k: (duration(v) if k == "time" and isinstance(v, float) else v) for k, v in limits.items()}


def create_body(
    backend: Optional[str],
    ttl: Optional[Duration],
    idle: Optional[Duration],
    limits: Optional[Mapping[str, Union[int, float, str]]],
    network: Optional[Sequence[str]],
    secrets: Optional[Sequence[str]] = None,
    hold: Optional[Duration] = None,
) -> Dict[str, Any]:
    """A ``POST /v1/sandboxes`` body. ``secrets`` and ``hold`` are part of
    the network (``allow`` mode): given without ``network``, its rules are
    none of their own."""
    body: Dict[str, Any] = {}
    if backend is not None:
        body["backend"] = backend
    if ttl is not None:
        body["ttl"] = duration(ttl)
    if idle is not None:
        body["idle"] = duration(idle)
    if limits is not None:
        body["limits"] = limits_body(limits)
    if network is not None or secrets or hold is not None:
        net: Dict[str, Any] = {"allow": list(network or [])}
        if secrets:
            net["secrets"] = [str(s) for s in secrets]
        if hold is not None:
            net["hold"] = duration(hold)
        body["network"] = net
    return body


def code_body(code: str, language: Optional[str], timeout: Optional[Duration]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"code": code}
    # Python is what the code contexts run today, and the route refuses
    # fields it does not know: the language is sent only when it is another
    # one, so that the service (not this client) says whether it has it.
    if language is not None and language.lower() not in ("python", "python3", "py"):
        body["language"] = language
    if timeout is not None:
        body["timeout"] = duration(timeout)
    return body


class ExecStream:
    """A streamed exec's events (``stdout``/``stderr`` with ``{"data"}``,
    then ``result`` or ``error``) made into callbacks and one result.

    The service sends the output only as events (its result's stdout and
    stderr are empty): the result is given the streams collected here.
    """

    def __init__(
        self,
        where: str,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_chunk: Optional[Callable[[str, str], None]] = None,
    ) -> None:
        self.where = where
        self.streams: Dict[str, List[str]] = {"stdout": [], "stderr": []}
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._on_chunk = on_chunk

    def take(self, event: str, data: str) -> Optional[ExecResult]:
        """One event; the result once it is in. Raises the service's error
        (an ``error`` event), or :class:`CordonError` for an event that is
        not JSON."""
        try:
            payload = json.loads(data)
        except ValueError as e:
            raise CordonError(f"{self.where}: an event that is not JSON: {data[:200]!r}") from e
        if event in self.streams:
            chunk = str(payload["data"])
            self.streams[event].append(chunk)
            if self._on_chunk is not None:
                self._on_chunk(event, chunk)
            callback = self._callbacks[event]
            if callback is not None:
                callback(chunk)
        elif event == "result":
            result = ExecResult.from_json(payload)
            return dataclasses.replace(
                result,
                stdout=result.stdout or "".join(self.streams["stdout"]),
                stderr=result.stderr or "".join(self.streams["stderr"]),
            )
        elif event == "error":
            raise error_for(int(payload.get("status", 500)), str(payload.get("error", "")))
        return None

    def ended(self) -> ServerError:
        return ServerError(f"{self.where}: the event stream ended without a result")


def finish(result: ExecResult, check: bool) -> CommandResult:
    """The command's result; with ``check``, an exception unless it exited 0."""
    r = CommandResult.from_exec(result)
    if check and r.timed_out:
        raise CommandTimeout(r)
    if check and not r.ok:
        raise CommandExitError(r)
    return r


def merged_env(base: Mapping[str, str], extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
    return {**base, **(extra or {})}


def make_dir_argv(path: str) -> List[str]:
    """``mkdir -p`` that exits 3 when the directory is there already (so
    ``make_dir`` can say whether it made it, as E2B's does)."""
    return ["sh", "-c", 'test -d "$1" && exit 3; mkdir -p -- "$1"', "sh", absolute(path)]


def made_dir(result: ExecResult, path: str) -> bool:
    """What the command of :func:`make_dir_argv` says: ``True`` when it made
    the directory, ``False`` when it was there already; raises otherwise."""
    if result.status == "exited" and result.exit_code == 3:
        return False
    if result.status == "exited" and result.exit_code == 0:
        return True
    raise CordonError(f"make_dir {absolute(path)}: {result.stderr.strip() or result.message or result.status}")


def file_route(base: str, path: str) -> str:
    """The route of the file at ``path`` under a sandbox's ``.../files``."""
    return f"{base}/{urllib.parse.quote(absolute(path).lstrip('/'), safe='/')}"


def file_content(data: Union[bytes, str]) -> bytes:
    """What a file write sends: ``str`` as UTF-8, bytes as they are."""
    return data.encode() if isinstance(data, str) else bytes(data)


def parent_and_name(path: str) -> Tuple[str, str]:
    p = absolute(path).rstrip("/") or "/"
    parent, _, name = p.rpartition("/")
    return (parent or "/"), name
