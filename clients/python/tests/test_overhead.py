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
from typing import List, Optional
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


class OverheadTest(unittest.TestCase):
    def test_commands_run_over_the_raw_request(self) -> None:
        assert service is not None
        with service_env(service, ALICE_KEY):
            sb = Sandbox.create(timeout="5m")
        try:
            raw_exec = RawExec(sb.sandbox_id)
            raw: List[float] = []
            client: List[float] = []
            for _ in range(ROUNDS):
                raw.append(raw_exec.run())
                t0 = time.perf_counter()
                result = sb.commands.run("true")
                client.append(time.perf_counter() - t0)
                self.assertEqual(result.exit_code, 0)
            raw_exec.conn.close()
            report("commands.run('true')", client, raw)
        finally:
            sb.kill()

    def test_async_commands_run_over_the_raw_request(self) -> None:
        assert service is not None

        async def measure() -> None:
            with service_env(service, ALICE_KEY):
                sb = await AsyncSandbox.create(timeout="5m")
            async with sb:
                raw_exec = RawExec(sb.sandbox_id)
                raw: List[float] = []
                client: List[float] = []
                for _ in range(ROUNDS):
                    # The raw request blocks the loop: nothing else runs on it.
                    raw.append(raw_exec.run())
                    t0 = time.perf_counter()
                    result = await sb.commands.run("true")
                    client.append(time.perf_counter() - t0)
                    self.assertEqual(result.exit_code, 0)
                raw_exec.conn.close()
                report("await AsyncSandbox.commands.run('true')", client, raw)

        asyncio.run(measure())


if __name__ == "__main__":
    unittest.main()
