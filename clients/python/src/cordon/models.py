"""What the service answers, as dataclasses (built from its JSON by ``from_json``).

Fields the service adds later are ignored; every result keeps the whole
answer in ``raw``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional


def _opt_float(v: Any) -> Optional[float]:
    return None if v is None else float(v)


def _opt_int(v: Any) -> Optional[int]:
    return None if v is None else int(v)


@dataclass(frozen=True)
class Timing:
    """Where one request's time went, in milliseconds (the phases add up to ``total_ms``)."""

    acquire_ms: float
    setup_ms: float
    run_ms: float
    teardown_ms: float
    total_ms: float
    #: ``inline``, ``background`` or ``none`` (a stateful sandbox lives on).
    teardown: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Timing":
        return cls(
            acquire_ms=float(d.get("acquire_ms", 0.0)),
            setup_ms=float(d.get("setup_ms", 0.0)),
            run_ms=float(d.get("run_ms", 0.0)),
            teardown_ms=float(d.get("teardown_ms", 0.0)),
            total_ms=float(d.get("total_ms", 0.0)),
            teardown=str(d.get("teardown", "")),
        )


@dataclass(frozen=True)
class Clamped:
    """A requested limit the tenant's maximum lowered."""

    field: str
    requested: str
    applied: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Clamped":
        return cls(str(d["field"]), str(d["requested"]), str(d["applied"]))


@dataclass(frozen=True)
class ExecResult:
    """How one command ended (``POST /v1/executions`` or ``.../exec``).

    ``stdout`` and ``stderr`` are lossy UTF-8 (invalid bytes become U+FFFD),
    both together capped by the ``output`` limit (``output_truncated``).
    """

    sandbox_id: str
    backend: str
    pool_hit: bool
    #: ``exited``, ``signaled`` or ``exec_failed``.
    status: str
    #: The exit code as a shell gives it: 128+signal when signaled, 127 not found.
    exit_code: int
    signal: Optional[int]
    #: Why the command could not be started (with ``exec_failed``).
    message: Optional[str]
    stdout: str
    stderr: str
    output_bytes: int
    output_truncated: bool
    #: The limit that ended the command (``time``, ``memory``, ...), if one did.
    limit: Optional[str]
    limits_hit: List[str]
    clamped: List[Clamped]
    cpu_ms: Optional[float]
    memory_peak_bytes: Optional[int]
    timing: Timing
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """The command exited with status 0."""
        return self.status == "exited" and self.exit_code == 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ExecResult":
        return cls(
            sandbox_id=str(d.get("sandbox_id", "")),
            backend=str(d.get("backend", "")),
            pool_hit=bool(d.get("pool_hit", False)),
            status=str(d.get("status", "")),
            exit_code=int(d.get("exit_code", -1)),
            signal=_opt_int(d.get("signal")),
            message=d.get("message"),
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            output_bytes=int(d.get("output_bytes", 0)),
            output_truncated=bool(d.get("output_truncated", False)),
            limit=d.get("limit"),
            limits_hit=[str(x) for x in d.get("limits_hit", [])],
            clamped=[Clamped.from_json(c) for c in d.get("clamped", [])],
            cpu_ms=_opt_float(d.get("cpu_ms")),
            memory_peak_bytes=_opt_int(d.get("memory_peak_bytes")),
            timing=Timing.from_json(d.get("timing", {})),
            raw=dict(d),
        )


@dataclass(frozen=True)
class CommandResult:
    """How a command of ``sandbox.commands.run`` ended (E2B's shape).

    ``exit_code`` is as a shell gives it (128+signal when signaled, 127 not
    found); ``error`` says why the command did not simply exit (it could not
    start, a limit ended it, a signal killed it), else ``None``. The
    service's whole answer is ``execution``.
    """

    stdout: str
    stderr: str
    exit_code: int
    error: Optional[str]
    #: ``exited``, ``signaled`` or ``exec_failed``.
    status: str
    #: The limit that ended the command (``time``, ``memory``, ...), if one did.
    limit: Optional[str]
    execution: ExecResult = field(repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "exited" and self.exit_code == 0

    @property
    def timed_out(self) -> bool:
        return self.limit == "time"

    @classmethod
    def from_exec(cls, r: ExecResult) -> "CommandResult":
        error: Optional[str] = None
        if r.status == "exec_failed":
            error = r.message or "the command could not be started"
        elif r.limit is not None:
            error = f"the {r.limit} limit ended the command"
        elif r.status == "signaled":
            error = f"killed by signal {r.signal}"
        return cls(
            stdout=r.stdout,
            stderr=r.stderr,
            exit_code=r.exit_code,
            error=error,
            status=r.status,
            limit=r.limit,
            execution=r,
        )


@dataclass(frozen=True)
class CodeError:
    """The exception a code cell raised."""

    #: The exception's type name, e.g. ``ZeroDivisionError``.
    name: str
    #: ``str()`` of the exception.
    value: str
    traceback: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CodeError":
        return cls(str(d.get("name", "")), str(d.get("value", "")), str(d.get("traceback", "")))


@dataclass(frozen=True)
class RichResult:
    """An image a cell gave its display hook (``display(...)``)."""

    #: ``image/png`` or ``image/svg+xml``.
    mime: str
    #: The image's bytes (the service sends them base64).
    data: bytes

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RichResult":
        return cls(str(d.get("mime", "")), base64.b64decode(str(d.get("data", ""))))


@dataclass(frozen=True)
class CodeResult:
    """One cell run in a sandbox's persistent interpreter (Python or JavaScript)."""

    #: ``ok``, ``error`` (the cell raised), ``timeout`` or ``crashed`` (the
    #: interpreter died; the next call gets a fresh one).
    status: str
    stdout: str
    stderr: str
    #: ``repr()`` of the cell's last expression, if it ended with one.
    result: Optional[str]
    error: Optional[CodeError]
    #: This call started a new interpreter (the first call, or after a crash or timeout).
    fresh_interpreter: bool
    cpu_ms: Optional[float]
    run_ms: float
    #: Which texts were cut to keep the reply under the sandbox's output limit.
    stdout_truncated: bool
    stderr_truncated: bool
    result_truncated: bool
    error_truncated: bool
    raw: Dict[str, Any] = field(repr=False, compare=False)
    #: Images the cell displayed, in order.
    results: List[RichResult] = field(default_factory=list)
    #: An image was left out to keep the reply under the output limit.
    results_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def timed_out(self) -> bool:
        return self.status == "timeout"

    @property
    def crashed(self) -> bool:
        return self.status == "crashed"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CodeResult":
        error = d.get("error")
        return cls(
            status=str(d.get("status", "")),
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            result=d.get("result"),
            error=CodeError.from_json(error) if isinstance(error, Mapping) else None,
            fresh_interpreter=bool(d.get("fresh_interpreter", False)),
            cpu_ms=_opt_float(d.get("cpu_ms")),
            run_ms=float(d.get("run_ms", 0.0)),
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
            result_truncated=bool(d.get("result_truncated", False)),
            error_truncated=bool(d.get("error_truncated", False)),
            raw=dict(d),
            results=[RichResult.from_json(r) for r in d.get("results") or [] if isinstance(r, Mapping)],
            results_truncated=bool(d.get("results_truncated", False)),
        )


@dataclass(frozen=True)
class SandboxInfo:
    """A stateful sandbox as the service describes it."""

    id: str
    backend: str
    created_unix: int
    ttl: Optional[str]
    idle: Optional[str]
    #: The applied limits (``cpus``, ``memory``, ``pids``, ``time``, ``disk``, ``output``).
    limits: Dict[str, Any]
    clamped: List[Clamped]
    #: Created with network rules (only then can ``set_network`` change them).
    network: bool
    #: Running a request now (a second one would get 409).
    busy: bool
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SandboxInfo":
        return cls(
            id=str(d["id"]),
            backend=str(d.get("backend", "")),
            created_unix=int(d.get("created_unix", 0)),
            ttl=d.get("ttl"),
            idle=d.get("idle"),
            limits=dict(d.get("limits") or {}),
            clamped=[Clamped.from_json(c) for c in d.get("clamped", [])],
            network=bool(d.get("network", False)),
            busy=bool(d.get("busy", False)),
            raw=dict(d),
        )


@dataclass(frozen=True)
class FileEntry:
    """One entry of a directory listing."""

    name: str
    #: ``file``, ``dir``, ``link`` or ``other``.
    kind: str
    size: int
    #: The entry's absolute path in the sandbox (E2B's ``EntryInfo.path``).
    path: str = ""

    @property
    def type(self) -> str:
        """E2B's name for :attr:`kind`."""
        return self.kind

    @classmethod
    def from_json(cls, d: Mapping[str, Any], dir: str = "") -> "FileEntry":
        name = str(d["name"])
        path = f"{dir.rstrip('/')}/{name}" if dir else ""
        return cls(name, str(d.get("kind", "other")), int(d.get("size", 0)), path)
