"""`rclc-graph serve` as a subprocess on a loopback port, for tests that need a real server
process (SIGKILL, restart, browsers, load)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

from tests.paths import ROOT



_SERVERS = itertools.count()


class ServeProcess:
    """One `python -m rclc_graph serve ...` process; `url` once it answers."""

    def __init__(self, runs: Path, *, port: int = 0, options: tuple[str, ...] = (),
                 log: Path | None = None, topologies: Path = ROOT / "topologies") -> None:
        """port 0 (the default): the server takes a free port itself and says which (`serving on
        URL` in its log), so two test processes never race for a port picked in advance."""
        self.port = port
        self.url = ""
        self.command = [sys.executable, "-m", "rclc_graph", "serve", "--topologies", str(topologies),
                        "--runs", str(runs), "--port", str(port), "--log-level", "warning", *options]
        self.log = log or runs.parent / f"serve-{os.getpid()}-{next(_SERVERS)}.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> ServeProcess:
        environment = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self._log_handle = open(self.log, "ab")
        start, self.url = self._log_handle.tell(), ""
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=environment, stdout=self._log_handle,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited with {self.process.returncode}: {self.log.read_text()[-3000:]}")
            if not self.url:
                self._read_url(start)
            try:
                if self.url and httpx.get(self.url + "/server", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"serve did not answer: {self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def _read_url(self, start: int) -> None:
        with open(self.log, "rb") as log:
            log.seek(start)
            found = re.search(rb"serving on (http://\S+):(\d+)", log.read())
        if found:
            self.url, self.port = f"{found[1].decode()}:{int(found[2])}", int(found[2])

    def kill(self) -> None:
        """SIGKILL: nothing gets to clean up."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
        self._close_log()

    def stop(self) -> None:
        """SIGTERM: a graceful stop (running runs are cancelled and recorded)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._close_log()

    def _close_log(self) -> None:
        handle = getattr(self, "_log_handle", None)
        if handle is not None and not handle.closed:
            handle.close()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def sse_messages(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """SSE messages as they arrive: {"id", "event", "data"} (data parsed)."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "data" in fields:
                yield {"id": fields.get("id"), "event": fields.get("event"), "data": json.loads(fields["data"])}
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


def example_inputs(name: str) -> dict[str, Any]:
    return json.loads((ROOT / "examples" / "inputs" / f"{name}.json").read_text(encoding="utf-8"))
