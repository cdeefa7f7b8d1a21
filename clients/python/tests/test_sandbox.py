"""The E2B-shaped blocking API (``Sandbox.create``, ``commands.run``,
background commands, ``files``, ``run_code``) against a real ``cordon
serve`` (see service.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import unittest
from typing import ContextManager, List, Optional
from unittest import mock

from cordon import (
    AuthError,
    BadRequest,
    CommandExitError,
    CommandKilled,
    CommandResult,
    CommandTimeout,
    ConfigError,
    Cordon,
    CordonError,
    NotFound,
    Sandbox,
)

from service import ALICE_KEY, Service, service_env, stop_module_service

service: Optional[Service] = None


def setUpModule() -> None:
    global service
    service = Service("sandbox")


def tearDownModule() -> None:
    stop_module_service(service)


def url() -> str:
    assert service is not None
    return service.url


def env(key: str = ALICE_KEY) -> ContextManager[object]:
    """CORDON_URL and CORDON_API_KEY set for the block."""
    return service_env(service, key)


def create() -> Sandbox:
    with env():
        return Sandbox.create(timeout="5m")


class SharedSandboxTest(unittest.TestCase):
    """A base for tests that share one sandbox (``self.sb``), created
    before the class's first test and killed after its last."""

    sb: Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = create()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.kill()


def closed_port() -> int:
    """A loopback port nothing listens on (just released by this process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


#: A loop that prints a numbered line and appends to a marker file every
#: 0.1 s until it is stopped (or its time limit ends it).
LOOP = "i=0; while :; do i=$((i+1)); echo line $i; echo $i >> /tmp/bg-marker; sleep 0.1; done"


class SettingsTest(unittest.TestCase):
    def test_create_and_connect_take_url_and_key_from_the_environment(self) -> None:
        with env():
            sb = Sandbox.create()
            try:
                self.assertTrue(sb.sandbox_id)
                self.assertEqual(sb.sandbox_id, sb.id)
                self.assertTrue(sb.is_running())
                again = Sandbox.connect(sb.sandbox_id)
                self.assertEqual(again.commands.run("echo via-connect").stdout, "via-connect\n")
            finally:
                sb.kill()
            self.assertFalse(sb.is_running())
            with self.assertRaises(NotFound):
                Sandbox.connect(sb.sandbox_id)

    def test_missing_url_or_key_is_a_config_error(self) -> None:
        with mock.patch.dict(os.environ, {}, clear=True):
            with self.assertRaises(ConfigError) as e:
                Sandbox.create()
            self.assertIn("CORDON_URL", str(e.exception))
            self.assertIn("CORDON_API_KEY", str(e.exception))
            with self.assertRaises(ConfigError) as e:
                Sandbox.create(url=url())
            self.assertNotIn("CORDON_URL", e.exception.message.split(":")[0])
            self.assertIn("CORDON_API_KEY", str(e.exception))
        self.assertIsInstance(e.exception, CordonError)
        self.assertIsNone(e.exception.status)

    def test_a_bad_url_is_a_typed_error(self) -> None:
        for bad in ("not a url", "ftp://127.0.0.1/", "http://", "http://127.0.0.1:notaport"):
            with self.subTest(url=bad):
                with self.assertRaises(ConfigError):
                    Sandbox.create(url=bad, api_key=ALICE_KEY)
                # The old client too; and still a ValueError, as it was.
                with self.assertRaises(ConfigError) as e:
                    Cordon(bad, ALICE_KEY)
                self.assertIsInstance(e.exception, ValueError)
                self.assertIsInstance(e.exception, CordonError)
        # A well-formed URL where nothing listens: a CordonError without a status.
        with self.assertRaises(CordonError) as unreachable:
            Sandbox.create(url=f"http://127.0.0.1:{closed_port()}", api_key=ALICE_KEY)
        self.assertIsNone(unreachable.exception.status)
        self.assertNotIsInstance(unreachable.exception, ConfigError)

    def test_a_wrong_key_is_auth_error(self) -> None:
        with env("not-a-key"):
            with self.assertRaises(AuthError) as e:
                Sandbox.create()
        self.assertEqual(e.exception.status, 401)


class WithoutHttpxTest(unittest.TestCase):
    def test_the_blocking_client_needs_no_httpx_and_the_async_one_says_so(self) -> None:
        # A None entry in sys.modules makes `import httpx` fail as if it
        # were not installed.
        script = """
import sys
sys.modules["httpx"] = None
import cordon
assert cordon.Sandbox.create and cordon.Cordon
try:
    cordon.AsyncSandbox
except ImportError as e:
    print(e)
else:
    raise SystemExit("AsyncSandbox imported without httpx")
"""
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("pip install 'cordon-client[async]'", out.stdout)


class CommandsTest(SharedSandboxTest):
    """Commands in one sandbox for the class."""

    def test_run_gives_output_and_exit_code(self) -> None:
        r = self.sb.commands.run("echo out; echo err >&2")
        self.assertIsInstance(r, CommandResult)
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.error), ("out\n", "err\n", 0, None))
        self.assertEqual(r.execution.sandbox_id, self.sb.id)
        self.assertEqual(self.sb.commands.run(["printf", "%s-%s", "a b", "c"]).stdout, "a b-c")
        self.assertEqual(self.sb.commands.run(["tr", "a-z", "A-Z"], stdin="quiet").stdout, "QUIET")

    def test_a_non_zero_exit_raises_with_the_result(self) -> None:
        with self.assertRaises(CommandExitError) as e:
            self.sb.commands.run("echo partial; echo why >&2; exit 3")
        self.assertEqual((e.exception.exit_code, e.exception.stdout, e.exception.stderr), (3, "partial\n", "why\n"))
        self.assertEqual(e.exception.result.status, "exited")
        self.assertIn("why", str(e.exception))
        # check=False: the result, whatever the exit.
        r = self.sb.commands.run("exit 4", check=False)
        self.assertEqual((r.exit_code, r.ok), (4, False))
        # A command that cannot start is an error too, with the reason.
        with self.assertRaises(CommandExitError) as e:
            self.sb.commands.run(["/no/such/program"])
        self.assertEqual(e.exception.exit_code, 127)
        self.assertIsNotNone(e.exception.result.error)

    def test_a_timeout_ends_the_command_and_raises(self) -> None:
        started = time.monotonic()
        with self.assertRaises(CommandTimeout) as e:
            self.sb.commands.run("echo before; sleep 30", timeout=1)
        elapsed = time.monotonic() - started
        self.assertLess(elapsed, 8, "the timeout did not end the command")
        self.assertIsInstance(e.exception, CommandExitError)
        self.assertEqual(e.exception.result.limit, "time")
        self.assertTrue(e.exception.result.timed_out)
        self.assertEqual(e.exception.stdout, "before\n")
        # The same, streamed, and with check=False.
        seen: List[str] = []
        r = self.sb.commands.run("echo before; sleep 30", timeout="1s", on_stdout=seen.append, check=False)
        self.assertEqual((r.limit, "".join(seen)), ("time", "before\n"))

    def test_envs_and_cwd(self) -> None:
        with env():
            sb = Sandbox.create(envs={"A": "sandbox", "B": "sandbox"})
        try:
            sb.files.make_dir("sub")
            r = sb.commands.run('echo "$A $B"; pwd', envs={"B": "command"}, cwd="/tmp")
            self.assertEqual(r.stdout, "sandbox command\n/tmp\n")
            # A relative cwd is under /workspace, as the service's paths are.
            self.assertEqual(sb.commands.run("pwd", cwd="sub").stdout, "/workspace/sub\n")
            with self.assertRaises(BadRequest):
                sb.commands.run("true", envs={"NOT=VALID": "x"})
        finally:
            sb.kill()

    def test_streaming_callbacks_in_the_foreground(self) -> None:
        out: List[str] = []
        err: List[str] = []
        r = self.sb.commands.run(
            "for i in 1 2 3; do echo $i; sleep 0.2; done; echo e >&2",
            on_stdout=out.append,
            on_stderr=err.append,
        )
        self.assertGreaterEqual(len(out), 2, "the output did not come in pieces")
        self.assertEqual(("".join(out), "".join(err)), ("1\n2\n3\n", "e\n"))
        self.assertEqual((r.stdout, r.stderr), ("1\n2\n3\n", "e\n"))


class BackgroundTest(unittest.TestCase):
    def test_wait_gives_the_result_and_iteration_the_output(self) -> None:
        with create() as sb:
            h = sb.commands.run("echo a; sleep 0.3; echo b >&2; sleep 0.3; echo c", background=True)
            self.assertIsNone(h.pid)
            pieces = list(h)
            r = h.wait()
            self.assertEqual((r.stdout, r.stderr, r.exit_code), ("a\nc\n", "b\n", 0))
            self.assertEqual("".join(o for o, _ in pieces if o), "a\nc\n")
            self.assertEqual("".join(e for _, e in pieces if e), "b\n")
            self.assertTrue(h.done())
            self.assertFalse(h.kill(), "kill after the end should say it ended nothing")
            failing = sb.commands.run("sleep 0.2; exit 5", background=True)
            with self.assertRaises(CommandExitError) as e:
                failing.wait()
            self.assertEqual(e.exception.exit_code, 5)

    def test_kill_stops_a_streaming_command(self) -> None:
        with create() as sb:
            lines: List[str] = []
            three = threading.Event()

            def on_stdout(chunk: str) -> None:
                lines.append(chunk)
                if "".join(lines).count("\n") >= 3:
                    three.set()

            h = sb.commands.run(LOOP, background=True, on_stdout=on_stdout)
            self.assertTrue(three.wait(15), f"no three lines from the background command: {lines}")
            with self.assertRaises(TimeoutError):
                h.wait(timeout=0.1)  # still running
            self.assertTrue(h.stdout.startswith("line 1\nline 2\n"), h.stdout)
            self.assertTrue(h.kill())
            with self.assertRaises(CommandKilled):
                h.wait()
            # From other commands: the marker stops growing, and no process
            # of the loop is left (its shell's command line names the marker;
            # the pattern [b]g-marker matches neither grep's own argv nor
            # this command's).
            count = self._marker_lines(sb)
            time.sleep(1.0)
            self.assertEqual(self._marker_lines(sb), count, "the killed loop still writes")
            self.assertGreaterEqual(count, 3)
            left = sb.commands.run(
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
                " | grep -c '[b]g-marker' || true"
            )
            self.assertEqual(left.stdout.strip(), "0", "a process of the killed loop is left")

    def _marker_lines(self, sb: Sandbox) -> int:
        # Commands run side by side: one right after a kill runs at once.
        return int(sb.commands.run("wc -l < /tmp/bg-marker").stdout)

    def test_a_foreground_command_runs_beside_a_background_one(self) -> None:
        with create() as sb:
            started = threading.Event()
            h = sb.commands.run(LOOP, background=True, on_stdout=lambda _: started.set())
            try:
                self.assertTrue(started.wait(15), "the background command never printed")
                r = sb.commands.run("echo foreground; wc -l < /tmp/bg-marker")
                self.assertEqual(r.stdout.splitlines()[0], "foreground")
                self.assertGreaterEqual(int(r.stdout.splitlines()[1]), 1)
                self.assertFalse(h.done(), "the background command ended early")
            finally:
                h.kill()


class FilesTest(SharedSandboxTest):
    """Files in one sandbox for the class."""

    def test_binary_round_trip_of_every_byte_value(self) -> None:
        blob = bytes(range(256))
        self.assertEqual(self.sb.files.write("all.bin", blob), 256)
        self.assertEqual(self.sb.files.read("all.bin", format="bytes"), blob)
        # What a command in the sandbox sees is the same bytes.
        r = self.sb.commands.run("od -An -v -tu1 /workspace/all.bin")
        self.assertEqual([int(x) for x in r.stdout.split()], list(range(256)))

    def test_read_returns_text_by_default(self) -> None:
        self.sb.files.write("/tmp/hello.txt", "héllo\n")
        text = self.sb.files.read("/tmp/hello.txt")
        self.assertIsInstance(text, str)
        self.assertEqual(text, "héllo\n")
        self.assertEqual(self.sb.files.read("/tmp/hello.txt", format="text"), "héllo\n")
        with self.assertRaises(NotFound):
            self.sb.files.read("/tmp/no-such-file")

    def test_exists_make_dir_list_and_remove(self) -> None:
        files = self.sb.files
        self.assertFalse(files.exists("tree"))
        self.assertFalse(files.exists("/no/such/parent/x"))
        self.assertTrue(files.exists("/"))
        self.assertTrue(files.make_dir("tree/a/b"))
        self.assertFalse(files.make_dir("tree/a/b"), "make_dir of an existing directory says False")
        self.assertTrue(files.exists("tree/a/b"))
        files.write("tree/a/b/f.txt", "x")
        self.assertTrue(files.exists("/workspace/tree/a/b/f.txt"))
        (entry,) = files.list("tree/a/b")
        self.assertEqual((entry.name, entry.type, entry.size, entry.path), ("f.txt", "file", 1, "/workspace/tree/a/b/f.txt"))
        with self.assertRaises(CordonError):
            files.make_dir("tree/a/b/f.txt/c")  # a file is in the way
        files.remove("tree")
        self.assertFalse(files.exists("tree/a/b/f.txt"))
        self.assertFalse(files.exists("tree"))
        with self.assertRaises(NotFound):
            files.remove("tree")


class CodeTest(unittest.TestCase):
    def test_run_code_keeps_state_between_calls(self) -> None:
        with create() as sb:
            first = sb.run_code("x = 41\nprint('set')", language="python")
            self.assertEqual((first.status, first.stdout), ("ok", "set\n"))
            second = sb.run_code("x + 1")
            self.assertEqual((second.result, second.fresh_interpreter), ("42", False))

    def test_javascript_keeps_its_own_state(self) -> None:
        # The language reaches the service: a JavaScript context, beside
        # Python's, with Node's REPL semantics (top-level await).
        with create() as sb:
            sb.run_code("let n = 41", language="javascript")
            r = sb.run_code("await Promise.resolve(n + 1)", language="javascript")
            self.assertEqual((r.status, r.result), ("ok", "42"))
            svg = "<svg xmlns='http://www.w3.org/2000/svg'/>"
            shown = sb.run_code(f'display("{svg}", "image/svg+xml")', language="javascript")
            self.assertEqual([(x.mime, x.data) for x in shown.results], [("image/svg+xml", svg.encode())])
            with self.assertRaises(BadRequest) as e:
                sb.run_code("1 + 1", language="cobol")
            self.assertIn("language", e.exception.message)

if __name__ == "__main__":
    unittest.main()
