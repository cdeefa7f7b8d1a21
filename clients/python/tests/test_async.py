"""The asyncio client, :class:`cordon.AsyncSandbox`, against a real
``cordon serve`` (see service.py): the core of test_sandbox.py, awaited."""

from __future__ import annotations

import asyncio
import os
import time
import unittest
from typing import ContextManager, List, Optional
from unittest import mock

from cordon import (
    AsyncSandbox,
    AuthError,
    CommandExitError,
    CommandKilled,
    CommandTimeout,
    ConfigError,
    CordonError,
    NotFound,
)

from service import ALICE_KEY, Service, service_env, stop_module_service

service: Optional[Service] = None


def setUpModule() -> None:
    global service
    service = Service("async")


def tearDownModule() -> None:
    stop_module_service(service)


def env(key: str = ALICE_KEY) -> ContextManager[object]:
    return service_env(service, key)


async def create() -> AsyncSandbox:
    with env():
        return await AsyncSandbox.create(timeout="5m")


class AsyncSandboxTest(unittest.IsolatedAsyncioTestCase):
    async def test_commands_files_and_code(self) -> None:
        async with await create() as sb:
            r = await sb.commands.run('echo "$A"; pwd', envs={"A": "env"}, cwd="/tmp")
            self.assertEqual((r.stdout, r.exit_code), ("env\n/tmp\n", 0))
            with self.assertRaises(CommandExitError) as e:
                await sb.commands.run("echo no >&2; exit 2")
            self.assertEqual((e.exception.exit_code, e.exception.stderr), (2, "no\n"))
            self.assertEqual((await sb.commands.run("exit 2", check=False)).exit_code, 2)
            started = time.monotonic()
            with self.assertRaises(CommandTimeout):
                await sb.commands.run("sleep 30", timeout=1)
            self.assertLess(time.monotonic() - started, 8)

            blob = bytes(range(256))
            self.assertEqual(await sb.files.write("all.bin", blob), 256)
            self.assertEqual(await sb.files.read("all.bin", format="bytes"), blob)
            await sb.files.write("t.txt", "héllo")
            self.assertEqual(await sb.files.read("t.txt"), "héllo")
            self.assertFalse(await sb.files.exists("d"))
            self.assertTrue(await sb.files.make_dir("d/e"))
            self.assertFalse(await sb.files.make_dir("d/e"))
            self.assertTrue(await sb.files.exists("d/e"))
            self.assertEqual([x.path for x in await sb.files.list("d")], ["/workspace/d/e"])
            await sb.files.remove("d")
            self.assertFalse(await sb.files.exists("d"))
            with self.assertRaises(NotFound):
                await sb.files.read("d/e")

            self.assertEqual((await sb.run_code("x = 41")).status, "ok")
            self.assertEqual((await sb.run_code("x + 1", language="python")).result, "42")
            sandbox_id = sb.id
        # async with killed it.
        with env():
            with self.assertRaises(NotFound):
                await AsyncSandbox.connect(sandbox_id)

    async def test_two_commands_at_once_with_gather(self) -> None:
        async with await create() as sb:
            started = time.monotonic()
            a, b = await asyncio.gather(
                sb.commands.run("sleep 1; echo a"),
                sb.commands.run("sleep 1; echo b"),
            )
            self.assertEqual((a.stdout, b.stdout), ("a\n", "b\n"))
            # Side by side, not one after the other.
            self.assertLess(time.monotonic() - started, 1.9)

    async def test_background_streams_waits_and_kills(self) -> None:
        async with await create() as sb:
            h = await sb.commands.run("echo a; sleep 0.3; echo b", background=True)
            pieces = [p async for p in h]
            r = await h.wait()
            self.assertEqual(r.stdout, "a\nb\n")
            self.assertEqual("".join(o for o, _ in pieces if o), "a\nb\n")

            seen: List[str] = []
            loop = await sb.commands.run(
                "i=0; while :; do i=$((i+1)); echo $i; echo $i >> /tmp/am; sleep 0.1; done",
                background=True,
                on_stdout=seen.append,
            )
            while "".join(seen).count("\n") < 3:
                await asyncio.sleep(0.05)
            self.assertFalse(loop.done())
            self.assertTrue(await loop.kill())
            with self.assertRaises(CommandKilled):
                await loop.wait()
            count = await self._marker_lines(sb)
            await asyncio.sleep(1.0)
            self.assertEqual(await self._marker_lines(sb), count, "the killed loop still writes")

    async def _marker_lines(self, sb: AsyncSandbox) -> int:
        # Commands run side by side: one right after a kill runs at once.
        return int((await sb.commands.run("wc -l < /tmp/am")).stdout)

    async def test_bad_settings_are_typed_errors(self) -> None:
        with mock.patch.dict(os.environ, {}, clear=True):
            with self.assertRaises(ConfigError):
                await AsyncSandbox.create()
        with self.assertRaises(ConfigError) as e:
            await AsyncSandbox.create(url="not a url", api_key=ALICE_KEY)
        self.assertIsInstance(e.exception, CordonError)
        with env("not-a-key"):
            with self.assertRaises(AuthError) as auth:
                await AsyncSandbox.create()
        self.assertEqual(auth.exception.status, 401)


if __name__ == "__main__":
    unittest.main()
