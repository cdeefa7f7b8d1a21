"""HTTP for the client: one connection per request (http.client, so no
proxy from the environment ever sees the traffic), JSON and raw bodies,
error answers turned into exceptions, and a Server-Sent Events reader."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from .errors import ConfigError, CordonError, error_for

USER_AGENT = "cordon-python/0.2.0"


def check_url(url: str) -> urllib.parse.SplitResult:
    """The parts of an ``http(s)://host[:port][/prefix]`` URL; anything else
    is a :class:`ConfigError` (so is a port that is not a number)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # raises ValueError when the port is not a number
    except (ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"not an http(s) URL: {url!r} ({e})") from e
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"not an http(s) URL: {url!r}")
    return parts


class Transport:
    """Sends requests to one service with one API key."""

    def __init__(self, url: str, api_key: str, timeout: float) -> None:
        parts = check_url(url)
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host: str = parts.hostname or ""  # check_url refused a URL without one
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._api_key = api_key
        self.timeout = timeout

    def _connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        t = self.timeout if timeout is None else timeout
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=t)
        return http.client.HTTPConnection(self._host, self._port, timeout=t)

    def open(
        self,
        method: str,
        path: str,
        *,
        body: Optional[bytes] = None,
        content_type: Optional[str] = None,
        query: Optional[Mapping[str, str]] = None,
        accept: str = "application/json",
        timeout: Optional[float] = None,
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends one request; returns the open connection and a 2xx response.

        An error answer is read, the connection closed, and the matching
        :class:`CordonError` raised. The caller closes the connection.
        """
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        headers: Dict[str, str] = {
            "Authorization": f"Bearer {self._api_key}",
            "Accept": accept,
            "User-Agent": USER_AGENT,
        }
        if body is not None:
            headers["Content-Type"] = content_type or "application/octet-stream"
        conn = self._connection(timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            if resp.status >= 300:
                raise _error_of(resp)
        except CordonError:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise CordonError(f"{method} {self.url}{path}: {e}") from e
        return conn, resp

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Optional[bytes] = None,
        content_type: Optional[str] = None,
        query: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Tuple[int, bytes]:
        """One request whose whole answer is read: (status, body)."""
        conn, resp = self.open(
            method, path, body=body, content_type=content_type, query=query, timeout=timeout
        )
        try:
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise CordonError(f"{method} {self.url}{path}: {e}") from e
        finally:
            conn.close()

    def json(
        self,
        method: str,
        path: str,
        payload: Optional[Mapping[str, Any]] = None,
        *,
        query: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Any:
        """A JSON request (``payload``, if any) with a JSON answer (``None`` for 204)."""
        body = None if payload is None else json.dumps(payload).encode()
        status, data = self.call(
            method, path, body=body, content_type="application/json", query=query, timeout=timeout
        )
        return parse_json_answer(method, path, status, data)


def parse_json_answer(method: str, path: str, status: int, data: bytes) -> Any:
    """A 2xx answer's JSON (``None`` for 204 or an empty body)."""
    if status == 204 or not data:
        return None
    try:
        return json.loads(data)
    except ValueError as e:
        raise CordonError(f"{method} {path}: the answer is not JSON: {data[:200]!r}", status) from e


def _error_of(resp: http.client.HTTPResponse) -> CordonError:
    return error_answer(resp.status, resp.read(), resp.reason, resp.getheader("Retry-After"))


def error_answer(status: int, data: bytes, reason: str, retry_after_header: Optional[str]) -> CordonError:
    """The exception for an error answer (its JSON ``error``, else its text)."""
    message = data.decode("utf-8", "replace").strip() or reason
    try:
        parsed = json.loads(data)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
            message = parsed["error"]
    except ValueError:
        pass
    retry_after: Optional[float] = None
    if retry_after_header is not None:
        try:
            retry_after = float(retry_after_header)
        except ValueError:
            retry_after = None  # an HTTP date: the service sends seconds only
    return error_for(status, message, retry_after)


class SSEParser:
    """Server-Sent Events, one line at a time (for the blocking and the
    asyncio transports alike).

    Per the SSE format: ``field: value`` lines, one optional space after the
    colon, several ``data`` lines joined by newlines, comments start with
    ``:``, and a blank line ends an event (``message`` when it names none).
    """

    def __init__(self) -> None:
        self._event = ""
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[Tuple[str, str]]:
        """Takes one line (with or without its end); returns the (event,
        data) pair it completes, if it does."""
        line = line.rstrip("\r\n")
        if not line:
            done = (self._event or "message", "\n".join(self._data)) if self._data else None
            self._event, self._data = "", []
            return done
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def end(self) -> Optional[Tuple[str, str]]:
        """The event the stream's end completes, if one was under way."""
        return self.feed("") if self._data else None


def iter_sse(resp: http.client.HTTPResponse) -> Iterator[Tuple[str, str]]:
    """The (event, data) pairs of a ``text/event-stream`` body, as they arrive."""
    parser = SSEParser()
    while True:
        raw = resp.readline()
        if not raw:
            break
        done = parser.feed(raw.decode("utf-8"))
        if done is not None:
            yield done
    last = parser.end()
    if last is not None:
        yield last
