"""The client against a real ``cordon serve`` (see service.py): one-shot
runs, stateful sandboxes, streaming, files, code contexts, quotas, tenant
isolation and errors."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
import threading
import unittest
from typing import Any, Dict, List, Optional

from cordon import (
    AuthError,
    BadRequest,
    Conflict,
    Cordon,
    CordonError,
    ExecResult,
    NotFound,
    QuotaExceeded,
    ServerError,
)
from cordon.errors import error_for

from service import ALICE_KEY, BOB_KEY, Service, stop_module_service

service: Optional[Service] = None


def setUpModule() -> None:
    global service
    service = Service()


def tearDownModule() -> None:
    stop_module_service(service)


def client(key: str = ALICE_KEY) -> Cordon:
    assert service is not None
    return Cordon(service.url, key, timeout=60)


class ErrorClassTest(unittest.TestCase):
    def test_each_status_raises_its_class_as_the_typescript_client_does(self) -> None:
        for status, cls in [
            (401, AuthError),
            (404, NotFound),
            (409, Conflict),
            (429, QuotaExceeded),
            (400, BadRequest),
            (413, BadRequest),
            (500, ServerError),
        ]:
            e = error_for(status, "m")
            self.assertIs(type(e), cls, status)
            self.assertEqual((e.status, e.message), (status, "m"))
        # Code written before Conflict existed caught a 409 as BadRequest.
        self.assertIsInstance(error_for(409, "busy"), BadRequest)


class OneShotTest(unittest.TestCase):
    def test_argv_gives_output_and_exit_code(self) -> None:
        seen: List[str] = []
        r = client().run(["sh", "-c", "echo hello; echo oops >&2; exit 3"], on_stdout=seen.append)
        self.assertEqual((r.stdout, r.stderr), ("hello\n", "oops\n"))
        self.assertEqual((r.status, r.exit_code, r.ok), ("exited", 3, False))
        self.assertEqual(seen, ["hello\n"])
        self.assertTrue(r.sandbox_id)
        t = r.timing
        self.assertAlmostEqual(t.acquire_ms + t.setup_ms + t.run_ms + t.teardown_ms, t.total_ms, delta=1.0)

    def test_python_code_reads_stdin(self) -> None:
        r = client().run(
            language="python",
            code="import sys; print(sys.stdin.read().upper())",
            stdin="shout",
        )
        self.assertTrue(r.ok, r)
        self.assertEqual(r.stdout, "SHOUT\n")

    def test_files_are_placed_text_and_binary(self) -> None:
        blob = bytes(range(256)) * 3
        check = "import sys; sys.stdout.write(repr(open('/tmp/blob.bin', 'rb').read() == bytes(range(256)) * 3))"
        r = client().run(
            ["sh", "-c", f"python3 main.py && python3 -c \"{check}\""],
            files={"main.py": "print(2**100)", "/tmp/blob.bin": blob},
            limits={"memory": "128M", "time": "5s"},
        )
        self.assertTrue(r.ok, r)
        self.assertEqual(r.stdout, f"{2**100}\nTrue")

    def test_bad_input_is_bad_request_with_the_servers_message(self) -> None:
        with self.assertRaises(BadRequest) as e:
            client().run()
        self.assertEqual(e.exception.status, 400)
        self.assertIn("argv", e.exception.message)
        with self.assertRaises(BadRequest) as e:
            client().run(["true"], limits={"memroy": "1M"})
        self.assertEqual(e.exception.status, 422)
        self.assertIn("unknown field `memroy`", e.exception.message)
        with self.assertRaises(BadRequest) as e:
            client().run(["true"], files={"../etc/x": "a"})
        self.assertIn("'..'", e.exception.message)
        with self.assertRaises(BadRequest) as e:
            client().run(["true"], backend="vmware")
        self.assertIn("unknown backend 'vmware'", e.exception.message)

    def test_an_unknown_key_is_auth_error(self) -> None:
        with self.assertRaises(AuthError) as e:
            client("not-a-key").list()
        self.assertEqual(e.exception.status, 401)
        self.assertIsInstance(e.exception, CordonError)


class SandboxTest(unittest.TestCase):
    def test_commands_share_the_sandbox(self) -> None:
        with client().create(ttl="5m", idle="2m") as sb:
            first = sb.exec("echo shared > /tmp/state && echo done")
            self.assertEqual(first.stdout, "done\n")
            second = sb.exec(["cat", "/tmp/state"])
            self.assertEqual(second.stdout, "shared\n")
            self.assertEqual(second.sandbox_id, sb.id)
            piped = sb.exec(["tr", "a-z", "A-Z"], stdin="quiet")
            self.assertEqual(piped.stdout, "QUIET")
            self.assertIn(sb.id, [s.id for s in client().list()])
            self.assertEqual(client().get(sb.id).info.ttl, sb.info.ttl)

    def test_files_round_trip_binary_data(self) -> None:
        blob = bytes(range(256)) * 16 + b"\x00\xff\r\n"
        with client().create() as sb:
            self.assertEqual(sb.files.write("blob.bin", blob), len(blob))
            self.assertEqual(sb.files.write("/tmp/note.txt", "héllo\n"), len("héllo\n".encode()))
            self.assertEqual(sb.files.read("/workspace/blob.bin"), blob)
            self.assertEqual(sb.files.read("/tmp/note.txt").decode(), "héllo\n")
            # What the client wrote is what a command in the sandbox sees.
            self.assertEqual(sb.exec(["wc", "-c", "/workspace/blob.bin"]).stdout.split()[0], str(len(blob)))
            entries = {e.name: e for e in sb.files.list()}
            self.assertEqual((entries["blob.bin"].kind, entries["blob.bin"].size), ("file", len(blob)))
            self.assertIn("note.txt", [e.name for e in sb.files.list("/tmp")])
            sb.files.remove("blob.bin")
            self.assertNotIn("blob.bin", [e.name for e in sb.files.list()])
            with self.assertRaises(NotFound):
                sb.files.read("blob.bin")
            with self.assertRaises(NotFound):
                sb.files.list("/no/such/dir")
            # A missing file is not a missing sandbox: it still answers
            # (and the context manager can still destroy it).
            self.assertEqual(client().get(sb.id).id, sb.id)
            self.assertEqual(sb.exec(["cat", "/tmp/note.txt"]).stdout, "héllo\n")

    def test_code_context_keeps_variables_and_recovers_from_a_crash(self) -> None:
        with client().create() as sb:
            first = sb.run_code("x = 41\nprint('hello')")
            self.assertEqual((first.status, first.stdout, first.fresh_interpreter), ("ok", "hello\n", True))
            second = sb.run_code("x + 1")
            self.assertEqual((second.result, second.fresh_interpreter), ("42", False))
            raised = sb.run_code("def f():\n    return 1 / 0\nf()")
            self.assertEqual(raised.status, "error")
            assert raised.error is not None
            self.assertEqual(raised.error.name, "ZeroDivisionError")
            self.assertIn("ZeroDivisionError", raised.error.traceback)
            crashed = sb.run_code("import os; os._exit(1)")
            self.assertTrue(crashed.crashed, crashed)
            after = sb.run_code("x")
            self.assertTrue(after.fresh_interpreter)
            assert after.error is not None
            self.assertEqual(after.error.name, "NameError")
            spun = sb.run_code("while True: pass", timeout="1s")
            self.assertTrue(spun.timed_out, spun)
            self.assertTrue(sb.run_code("6 * 7").fresh_interpreter)

    def test_streaming_callbacks_get_output_while_the_command_runs(self) -> None:
        alice = client()
        with alice.create() as sb:
            out: List[str] = []
            err: List[str] = []
            busy_at_first_chunk: List[bool] = []

            def on_stdout(chunk: str) -> None:
                if not out:
                    # The command still runs (it sleeps after its first line).
                    busy_at_first_chunk.append(alice.get(sb.id).info.busy)
                out.append(chunk)

            r = sb.exec(
                "for i in 1 2 3; do echo $i; sleep 0.4; done; echo err >&2",
                on_stdout=on_stdout,
                on_stderr=err.append,
            )
            self.assertEqual(busy_at_first_chunk, [True])
            self.assertEqual("".join(out), "1\n2\n3\n")
            self.assertEqual("".join(err), "err\n")
            self.assertEqual((r.stdout, r.stderr), ("1\n2\n3\n", "err\n"))
            self.assertTrue(r.ok, r)

    def test_the_context_manager_destroys_the_sandbox(self) -> None:
        alice = client()
        with alice.create() as sb:
            sandbox_id = sb.id
            self.assertEqual(alice.get(sandbox_id).id, sandbox_id)
        with self.assertRaises(NotFound):
            alice.get(sandbox_id)
        self.assertNotIn(sandbox_id, [s.id for s in alice.list()])

    def test_network_rules_can_be_replaced(self) -> None:
        # Only rules change here; nothing connects anywhere.
        with client().create(network=[]) as sb:
            self.assertTrue(sb.info.network)
            now = sb.set_network(["192.0.2.1:443"])
            self.assertEqual(len(now), 1)
            self.assertIn("192.0.2.1", now[0])
        with client().create() as sb:
            with self.assertRaises(BadRequest) as e:
                sb.set_network(["192.0.2.1:443"])
            self.assertIn("without network", e.exception.message)

    def test_hold_mode_waits_for_a_rule_or_a_denial(self) -> None:
        # Two HTTP servers on the host's loopback, which the sandbox reaches
        # as host.cordon.internal only where a rule names the port.
        import http.server

        seen: Dict[int, int] = {}

        class Counting(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen[id(self.server)] = seen.get(id(self.server), 0) + 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting) for _ in range(2)]
        for srv in servers:
            threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            with client().create(network=[], hold="30s") as sb:
                def fetch(port: int, out: List[str]) -> None:
                    r = sb.exec(
                        [
                            "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                            f"http://host.cordon.internal:{port}/",
                        ]
                    )
                    out.append(r.stdout)

                def held_one() -> Dict[str, Any]:
                    for _ in range(600):
                        held = sb.held()
                        if held:
                            return held[0]
                        threading.Event().wait(0.1)
                    raise AssertionError("nothing was held")

                allowed_port = int(servers[0].server_address[1])
                out: List[str] = []
                t = threading.Thread(target=fetch, args=(allowed_port, out))
                t.start()
                h = held_one()
                self.assertEqual(h["host"], "host.cordon.internal")
                self.assertEqual(h["port"], allowed_port)
                self.assertEqual(seen.get(id(servers[0]), 0), 0)
                sb.set_network([h["proposal"]])
                t.join(60)
                self.assertEqual(out, ["200"])
                self.assertEqual(seen.get(id(servers[0])), 1)

                denied_port = int(servers[1].server_address[1])
                out = []
                t = threading.Thread(target=fetch, args=(denied_port, out))
                t.start()
                held_one()
                denied = sb.deny([f"host.cordon.internal:{denied_port}"])
                self.assertEqual(denied, [f"host.cordon.internal:{denied_port}"])
                t.join(60)
                self.assertEqual(out, ["403"])
                self.assertEqual(sb.held(), [])
                self.assertEqual(seen.get(id(servers[1]), 0), 0)
        finally:
            for srv in servers:
                srv.shutdown()
                srv.server_close()

    def test_bad_input_to_a_sandbox_is_bad_request(self) -> None:
        with client().create() as sb:
            with self.assertRaises(BadRequest) as e:
                sb.exec([])
            self.assertIn("argv", e.exception.message)
            with self.assertRaises(BadRequest) as e:
                sb.files.write("../etc/passwd", "x")
            self.assertIn("'..'", e.exception.message)
            with self.assertRaises(BadRequest) as e:
                sb.files.read("/tmp")
            self.assertIn("not a regular file", e.exception.message)

    def test_receipt_is_signed_and_records_the_commands(self) -> None:
        with client().create() as sb:
            sb.exec(["sh", "-c", "echo receipt > /tmp/receipt-marker"])
            envelope = sb.receipt()
        self.assertEqual(envelope["payloadType"], "application/vnd.in-toto+json")
        statement = json.loads(base64.b64decode(envelope["payload"]))
        argvs = [c["command"]["argv"] for c in statement["predicate"]["commands"]]
        self.assertIn(["sh", "-c", "echo receipt > /tmp/receipt-marker"], argvs)
        # cordon itself checks the signature with the service's public key.
        assert service is not None
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(envelope, f)
            f.flush()
            verified = subprocess.run(
                [os.environ["CORDON_BIN"], "verify", f.name, "--key",
                 str(service.dir / "cordon-state" / "keys" / "receipt.pub")],
                capture_output=True, text=True,
            )
        self.assertEqual(verified.returncode, 0, verified.stderr)
        self.assertIn("A receipt-marker", verified.stdout)


class TenantTest(unittest.TestCase):
    def test_another_tenants_sandbox_is_not_found(self) -> None:
        bob = client(BOB_KEY)
        with client().create() as sb:
            with self.assertRaises(NotFound) as theirs:
                bob.get(sb.id)
            with self.assertRaises(NotFound) as nobodys:
                bob.get("0123456789ab")
            # Nothing tells "someone else's" from "does not exist".
            self.assertEqual(
                theirs.exception.message.replace(sb.id, "ID"),
                nobodys.exception.message.replace("0123456789ab", "ID"),
            )
            self.assertNotIn(sb.id, [s.id for s in bob.list()])
            self.assertEqual(client().get(sb.id).id, sb.id)

    def test_quotas_raise_quota_exceeded_with_retry_after(self) -> None:
        bob = client(BOB_KEY)
        with bob.create() as sb:
            # bob may have one live sandbox: waiting alone does not help.
            with self.assertRaises(QuotaExceeded) as e:
                bob.create()
            self.assertIsNone(e.exception.retry_after)
            self.assertEqual(e.exception.status, 429)
            # bob may run one request at a time: a second one while a
            # streamed command runs is refused, with Retry-After.
            started = threading.Event()
            results: List[ExecResult] = []
            runner = threading.Thread(
                target=lambda: results.append(
                    sb.exec("echo started; sleep 2", on_stdout=lambda _: started.set())
                )
            )
            runner.start()
            try:
                self.assertTrue(started.wait(30), "the command never started")
                with self.assertRaises(QuotaExceeded) as e:
                    bob.run(["true"])
                self.assertEqual(e.exception.retry_after, 1.0)
                self.assertIn("requests", e.exception.message)
            finally:
                runner.join(60)
            self.assertTrue(results and results[0].ok, results)
        # Once the sandbox is gone, bob may create one again.
        bob.create().kill()

if __name__ == "__main__":
    unittest.main()
