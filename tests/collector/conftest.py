"""Collector fixtures: an InfluxDB a test may stop and restart (same data directory, same port)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from helpers import InfluxServer, start_influxd, wait_http_ok


class RestartableInflux:
    """A test's own influxd (the session one must never go down): `stop_process()`, then `restart()`."""

    def __init__(self, server: InfluxServer) -> None:
        self.server = server

    def stop_process(self) -> None:
        """Stop influxd (SIGTERM: it closes its WAL cleanly), keeping its data directory and port."""
        proc = self.server.process
        assert proc is not None and proc.poll() is None
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self, timeout_s: float = 60.0) -> None:
        """Start influxd again with the same config (data directory, HTTP port) and wait for /ping."""
        config = self.server.workdir / "influxdb.conf"
        with open(self.server.log_path, "ab") as log:
            self.server.process = subprocess.Popen(
                [str(self.server.process.args[0]), "run", "-config", str(config)],  # type: ignore[union-attr]
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        assert wait_http_ok(f"{self.server.url}/ping", timeout_s, self.server.process), (
            "influxd did not restart"
        )


@pytest.fixture
def restartable_influxd() -> Iterator[RestartableInflux]:
    """A function-scoped influxd that the test may stop and restart; removed afterwards."""
    try:
        server = start_influxd()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield RestartableInflux(server)
    finally:
        server.stop()
