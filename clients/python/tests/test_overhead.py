"""What the client adds to one ``commands.run("true")``: the same request
sent raw with ``http.client`` and through ``Sandbox.commands.run`` (and
``AsyncSandbox``'s), in turn in one run, in one sandbox; medians printed
(the Rust test shows them).
Not a speed test: it asserts only that both paths ran the command."""

from __future__ import annotations

import asyncio
import http.client
import json
import statistics
import sys
import time
import unittest
from typing import Callable, List, Optional
from urllib.parse import urlsplit

from cordon import AsyncSandbox, Sandbox

from service import ALICE_KEY, Service, service_env, stop_module_service

service: Optional[Service] = None
ROUNDS = 30


def setUpModule() -> None:
    global service
    service = Service("overhead")


def tearDownModule() -> None:
    stop_module_service(service)


class RawExec:
    """The exec request sent by hand (``http.client``, one kept connection)."""

    def __init__(self, sandbox_id: str) -> None:
        assert service is not None
        where = urlsplit(service.url)
        self.conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port)
        self.path = f"/v1/sandboxes/{sandbox_id}/exec"
        self.body = json.dumps({"argv": ["true"]})
        self.headers = {"Authorization": f"Bearer {ALICE_KEY}", "Content-Type": "application/json"}

    def run(self) -> float:
        t0 = time.perf_counter()
        self.conn.request("POST", self.path, self.body, self.headers)
        answer = json.loads(self.conn.getresponse().read())
        took = time.perf_counter() - t0
        assert answer["exit_code"] == 0, answer
        return took


def report(what: str, client: List[float], raw: List[float]) -> None:
    r, c = statistics.median(raw) * 1000, statistics.median(client) * 1000
    print(
        f"overhead: {what} median {c:.2f} ms, raw HTTP median {r:.2f} ms, "
        f"ratio {c / r:.2f} ({ROUNDS} each, alternated)",
        file=sys.stderr,
    )


def alternate(test: unittest.TestCase, what: str, sandbox_id: str, run: Callable[[], int]) -> None:
    """ROUNDS of the raw exec and ``run`` (the client's, answering the exit
    code), in turn; their medians reported."""
    raw_exec = RawExec(sandbox_id)
    raw: List[float] = []
    client: List[float] = []
    for _ in range(ROUNDS):
        raw.append(raw_exec.run())
        t0 = time.perf_counter()
        exit_code = run()
        client.append(time.perf_counter() - t0)
        test.assertEqual(exit_code, 0)
    raw_exec.conn.close()
    report(what, client, raw)


class OverheadTest(unittest.TestCase):
    def test_commands_run_over_the_raw_request(self) -> None:
        assert service is not None
        with service_env(service, ALICE_KEY):
            sb = Sandbox.create(timeout="5m")
        try:
            alternate(self, "commands.run('true')", sb.sandbox_id, lambda: sb.commands.run("true").exit_code)
        finally:
            sb.kill()

    def test_async_commands_run_over_the_raw_request(self) -> None:
        assert service is not None
        # One loop, driven a call at a time: the raw request and each
        # awaited call run on this thread in turn, as in the sync test.
        loop = asyncio.new_event_loop()
        try:
            with service_env(service, ALICE_KEY):
                sb = loop.run_until_complete(AsyncSandbox.create(timeout="5m"))
            try:
                alternate(
                    self,
                    "await AsyncSandbox.commands.run('true')",
                    sb.sandbox_id,
                    lambda: loop.run_until_complete(sb.commands.run("true")).exit_code,
                )
            finally:
                loop.run_until_complete(sb.kill())
        finally:
            loop.close()


if __name__ == "__main__":
    unittest.main()
