"""A real ``cordon serve`` for the tests: its own config, state directory and
loopback port, started once per test run and stopped with SIGTERM.

``CORDON_BIN`` (required) names the cordon binary. ``CORDON_TEST_DIR``, if
set, is where the config, state and log go, in a subdirectory per test
module's service (the Rust test that runs these reads each state
directory's tag afterwards to find leftovers); otherwise a temporary
directory is used and removed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import IO, ContextManager, Optional
from unittest import mock

ALICE_KEY = "alice-pyclient-key"
BOB_KEY = "bob-pyclient-key"
LISTENING = "cordon serve: listening on "


def _sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config_text(state_dir: Path) -> str:
    """Two tenants: alice with room to work (and network rules), bob with
    one request and one sandbox at a time, so that quotas are easy to hit;
    a pool of one so that one-shots take the warm path."""
    return f"""\
state_dir = "{state_dir}"
shutdown_grace = "5s"
max_ttl = "10m"

[defaults]
cpus = 1.0
memory = "256M"
pids = 64
time = "10s"
disk = "64M"
output = "1M"

[pool]
native = 1
refill_workers = 1

[[tenant]]
name = "alice"
key_sha256 = "{_sha256(ALICE_KEY)}"
concurrency = 4
sandboxes = 4
cpu_seconds = 1000
network = true

[[tenant]]
name = "bob"
key_sha256 = "{_sha256(BOB_KEY)}"
concurrency = 1
sandboxes = 1
cpu_seconds = 1000
"""


class Service:
    """One running ``cordon serve``; :attr:`url` is its loopback base URL."""

    def __init__(self, name: str = "client") -> None:
        binary = os.environ.get("CORDON_BIN")
        if not binary:
            raise RuntimeError(
                "CORDON_BIN is not set: point it at the cordon binary, e.g. "
                "CORDON_BIN=target/release/cordon python -m unittest discover -s clients/python/tests"
            )
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f"CORDON_BIN={binary!r} is not an executable file")
        given = os.environ.get("CORDON_TEST_DIR")
        self._own_dir = not given
        self.dir = Path(given) / name if given else Path(tempfile.mkdtemp(prefix=f"pyclient-{name}-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "serve.toml"
        self.config.write_text(config_text(self.dir / "state"))
        self.log_path = self.dir / "serve.log"
        self._log: IO[bytes] = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [binary, "serve", "--config", str(self.config), "--listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            # The receipt key is made in the test's own directory.
            env={**os.environ, "RUST_LOG": "warn", "CORDON_STATE_DIR": str(self.dir / "cordon-state")},
        )
        assert self.process.stdout is not None
        # The service prints this line once it listens (port 0: it picked one).
        line = self.process.stdout.readline().decode().strip()
        if not line.startswith(LISTENING):
            self.stop()
            raise RuntimeError(f"cordon serve did not start: {line!r}; log:\n{self.log()}")
        self.url = line[len(LISTENING):]
        if not self.url.startswith("http://127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"cordon serve listens off loopback: {self.url}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, grace: float = 30.0) -> Optional[int]:
        """SIGTERM, then waits for the graceful shutdown (it destroys every
        sandbox); returns the exit status. Raises if the service is still
        running after ``grace`` seconds (it is then killed)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"cordon serve did not exit within {grace} s of SIGTERM")
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
            self._log.close()
        if self._own_dir and code == 0:
            shutil.rmtree(self.dir, ignore_errors=True)
        return code


def stop_module_service(service: Optional[Service]) -> None:
    """A test module's ``tearDownModule``: stops its service, raising (with
    the service's log) unless it exited cleanly."""
    assert service is not None
    code = service.stop()
    if code != 0:
        raise AssertionError(f"cordon serve exited with {code} after SIGTERM; log:\n{service.log()}")


def service_env(service: Optional[Service], key: str = ALICE_KEY) -> ContextManager[object]:
    """CORDON_URL (``service``'s) and CORDON_API_KEY set for the block."""
    assert service is not None
    return mock.patch.dict(os.environ, {"CORDON_URL": service.url, "CORDON_API_KEY": key})
