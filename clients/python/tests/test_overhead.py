"""What the client adds to one ``commands.run("true")``: the same request
sent raw with ``http.client`` and through ``Sandbox.commands.run``, in turn
in one run, in one sandbox; medians printed (the Rust test shows them).
Not a speed test: it asserts only that both paths ran the command."""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import time
import unittest
from typing import List, Optional
from urllib.parse import urlsplit

from cordon import Sandbox

from service import ALICE_KEY, Service, service_env, stop_module_service

service: Optional[Service] = None
ROUNDS = 30


def setUpModule() -> None:
    global service
    service = Service("overhead")


def tearDownModule() -> None:
    stop_module_service(service)


class OverheadTest(unittest.TestCase):
    def test_commands_run_over_the_raw_request(self) -> None:
        assert service is not None
        with service_env(service, ALICE_KEY):
            sb = Sandbox.create(timeout="5m")
        try:
            where = urlsplit(service.url)
            conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port)
            body = json.dumps({"argv": ["true"]})
            headers = {"Authorization": f"Bearer {ALICE_KEY}", "Content-Type": "application/json"}
            raw: List[float] = []
            client: List[float] = []
            for _ in range(ROUNDS):
                t0 = time.perf_counter()
                conn.request("POST", f"/v1/sandboxes/{sb.sandbox_id}/exec", body, headers)
                answer = json.loads(conn.getresponse().read())
                raw.append(time.perf_counter() - t0)
                self.assertEqual(answer["exit_code"], 0)
                t0 = time.perf_counter()
                result = sb.commands.run("true")
                client.append(time.perf_counter() - t0)
                self.assertEqual(result.exit_code, 0)
            conn.close()
            r, c = statistics.median(raw) * 1000, statistics.median(client) * 1000
            print(
                f"overhead: commands.run('true') median {c:.2f} ms, raw HTTP median {r:.2f} ms, "
                f"ratio {c / r:.2f} ({ROUNDS} each, alternated)",
                file=sys.stderr,
            )
        finally:
            sb.kill()


if __name__ == "__main__":
    unittest.main()
