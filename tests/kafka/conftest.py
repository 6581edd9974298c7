"""Fixtures of the Kafka tier: a real broker (KRaft, from `make kafka`), collectors as processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hoptrace.lab.influx import EVERY_PACKET
from hoptrace.lab.kafka import KafkaBroker, start_kafka
from hoptrace.lab.lifecycle import dies_with_parent
from hoptrace.lab.processes import InfluxServer, free_port
from hoptrace.lab.prometheus import scrape


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """One broker for the tier (each test uses its own topic and group); stopped and removed at the end."""
    try:
        broker = start_kafka()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


@dataclass
class CollectorProcess:
    """`hoptrace collector --kafka-brokers ...` as a process (so SIGKILL is a real crash)."""

    name: str
    argv: list[str]
    metrics: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> CollectorProcess:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(dies_with_parent(self.argv), stdout=log, stderr=subprocess.STDOUT)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics_now(self) -> dict[str, float]:
        return scrape(self.metrics)

    def wait_metric(self, predicate: Callable[[dict[str, float]], bool], timeout_s: float, what: str) -> dict:
        deadline = time.monotonic() + timeout_s
        last: dict[str, float] = {}
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, (
                f"{self.name} died:\n{self.log()[-3000:]}"
            )
            try:
                last = self.metrics_now()
            except OSError:
                last = {}
            if last and predicate(last):
                return last
            time.sleep(0.2)
        raise AssertionError(
            f"{self.name}: {what} not within {timeout_s} s; metrics {last}\n{self.log()[-3000:]}"
        )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.terminate()
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@dataclass
class KafkaLab:
    """Collectors of one group on one topic, writing one InfluxDB."""

    broker: KafkaBroker
    influx: InfluxServer
    topic: str
    group: str
    traces_file: Path
    workdir: Path
    collectors: list[CollectorProcess] = field(default_factory=list)

    def start_collector(self, *extra: str) -> CollectorProcess:
        n = len(self.collectors)
        metrics = f"127.0.0.1:{free_port()}"
        argv = [
            sys.executable,
            "-m",
            "hoptrace.cli.main",
            "collector",
            "--insecure",
            "--kafka-brokers",
            self.broker.bootstrap,
            "--kafka-topic",
            self.topic,
            "--kafka-group",
            self.group,
            "--kafka-session-timeout-ms",
            "3000",
            "--traces",
            str(self.traces_file),
            "--influx-url",
            self.influx.url,
            "--influx-bucket",
            self.influx.bucket,
            "--clock-listen",
            "",
            "--metrics-listen",
            metrics,
            "--spool-dir",
            str(self.workdir / f"spool-{n}"),
            # The tests count every packet's hop_latency points: keep every packet, not exemplars only.
            *EVERY_PACKET,
            *extra,
        ]
        c = CollectorProcess(f"collector-{n}", argv, metrics, self.workdir / f"collector-{n}.log").start()
        self.collectors.append(c)
        return c

    def stop(self) -> None:
        for c in self.collectors:
            c.stop()


@pytest.fixture
def kafka_lab(kafka_broker: KafkaBroker, influxd: InfluxServer, request: pytest.FixtureRequest) -> Iterator:
    """``make(spec, partitions)``: a topic, a group, the spec file; every collector stopped after."""
    labs: list[KafkaLab] = []
    workdir = Path(tempfile.mkdtemp(prefix="hoptrace-kafka-test-"))

    def make(spec: dict, partitions: int) -> KafkaLab:
        name = f"{request.node.name[:40]}-{os.urandom(3).hex()}".replace("[", "-").replace("]", "")
        topic = f"records-{name}"
        kafka_broker.create_topic(topic, partitions)
        traces = workdir / f"traces-{len(labs)}.json"
        traces.write_text(json.dumps(spec))
        lab = KafkaLab(kafka_broker, influxd, topic, f"group-{name}", traces, workdir)
        labs.append(lab)
        return lab

    try:
        yield make
    finally:
        for lab in labs:
            lab.stop()
        shutil.rmtree(workdir, ignore_errors=True)
