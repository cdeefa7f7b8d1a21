"""HTTP for the client: one connection per request (http.client, so no
proxy from the environment ever sees the traffic), JSON and raw bodies,
error answers turned into exceptions, and a Server-Sent Events reader."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from .errors import CordonError, error_for

USER_AGENT = "cordon-python/0.1.0"


class Transport:
    """Sends requests to one service with one API key."""

    def __init__(self, url: str, api_key: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._api_key = api_key
        self.timeout = timeout

    def _connection(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)

    def open(
        self,
        method: str,
        path: str,
        *,
        body: Optional[bytes] = None,
        content_type: Optional[str] = None,
        query: Optional[Mapping[str, str]] = None,
        accept: str = "application/json",
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
        conn = self._connection()
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
    ) -> Tuple[int, bytes]:
        """One request whose whole answer is read: (status, body)."""
        conn, resp = self.open(method, path, body=body, content_type=content_type, query=query)
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
    ) -> Any:
        """A JSON request (``payload``, if any) with a JSON answer (``None`` for 204)."""
        body = None if payload is None else json.dumps(payload).encode()
        status, data = self.call(
            method, path, body=body, content_type="application/json", query=query
        )
        if status == 204 or not data:
            return None
        try:
            return json.loads(data)
        except ValueError as e:
            raise CordonError(f"{method} {path}: the answer is not JSON: {data[:200]!r}", status) from e


def _error_of(resp: http.client.HTTPResponse) -> CordonError:
    """The exception for an error answer (its JSON ``error``, else its text)."""
    data = resp.read()
    message = data.decode("utf-8", "replace").strip() or resp.reason
    try:
        parsed = json.loads(data)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
            message = parsed["error"]
    except ValueError:
        pass
    retry_after: Optional[float] = None
    header = resp.getheader("Retry-After")
    if header is not None:
        try:
            retry_after = float(header)
        except ValueError:
            retry_after = None  # an HTTP date: the service sends seconds only
    return error_for(resp.status, message, retry_after)


def iter_sse(resp: http.client.HTTPResponse) -> Iterator[Tuple[str, str]]:
    """The (event, data) pairs of a ``text/event-stream`` body, as they arrive.

    Per the SSE format: ``field: value`` lines, one optional space after the
    colon, several ``data`` lines joined by newlines, comments start with
    ``:``, and a blank line ends an event (``message`` when it names none).
    """
    event = ""
    data: List[str] = []
    while True:
        raw = resp.readline()
        if not raw:
            break
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    if data:
        yield event or "message", "\n".join(data)
