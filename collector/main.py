"""`hoptrace collector`: command-line entry of the collector: parses flags, then `run_collector` runs the gRPC
collector (`service.py`) or the Kafka one (`kafka.py`) until a signal."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from hoptrace.collector.aggregate import AggregateConfig
from hoptrace.collector.captures import CaptureConfig
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.catalog_sync import follow_dispatcher
from hoptrace.collector.clockauth import read_key_file
from hoptrace.collector.influx import InfluxConfig
from hoptrace.collector.join import JoinConfig
from hoptrace.collector.kafka import KafkaCollectorService, KafkaConfig, read_secret_file
from hoptrace.collector.otlp import OtlpConfig
from hoptrace.collector.pipeline import CollectorConfig
from hoptrace.collector.receiver import ReceiverConfig
from hoptrace.collector.service import start_collector
from hoptrace.common.entry import ArgumentParser, run_command
from hoptrace.common.grpcutil import (
    INFLUX_TOKEN_ENV,
    TOKEN_ENV,
    TLSFiles,
    add_secret_argument,
    add_server_tls_arguments,
    api_channel,
    secret_from,
    server_tls_from_args,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the collector's flags to `parser` (the `hoptrace collector` subcommand)."""
    parser.add_argument("--listen", default="127.0.0.1:7071", help="gRPC address for agents (HOST:PORT)")
    parser.add_argument("--influx-url", default="http://127.0.0.1:8086", help="InfluxDB URL")
    parser.add_argument(
        "--influx-bucket", default="hoptrace/autogen", help="bucket; InfluxDB 1.8: DATABASE/RETENTION-POLICY"
    )
    parser.add_argument("--influx-org", default="-", help="organization (InfluxDB 1.8: ignored, '-')")
    add_secret_argument(parser, "influx-token", INFLUX_TOKEN_ENV, "the InfluxDB token (1.8: USER:PASSWORD)")
    parser.add_argument(
        "--traces", default=None, metavar="FILE", help="JSON/YAML trace specs giving each trace's hop path"
    )
    parser.add_argument(
        "--join-window", type=float, default=2.0, metavar="SECONDS", help="reorder window of the join"
    )
    parser.add_argument(
        "--max-pending", type=int, default=500_000, metavar="N", help="bound on packets waiting in the join"
    )
    parser.add_argument(
        "--dispatcher",
        default=None,
        metavar="ADDR",
        help="dispatcher gRPC address: follow its traces' paths (default: only --traces)",
    )
    parser.add_argument(
        "--clock-listen",
        default="127.0.0.1:7123",
        metavar="ADDR",
        help="UDP address of the NTP time service agents align their clocks on ('' = off)",
    )
    parser.add_argument(
        "--clock-key-file",
        default=None,
        metavar="FILE",
        help="shared secret (32+ bytes, raw or hex) authenticating clock rounds, given to the agents' "
        "--clock-key-file too (Kafka, --insecure); default: a random key per process, handed to each "
        "agent over its mutual TLS and rotated",
    )
    parser.add_argument(
        "--clock-key-rotate",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long each handed-out clock key is current (the previous one is still taken)",
    )
    parser.add_argument(
        "--metrics-listen",
        default="127.0.0.1:9171",
        metavar="ADDR",
        help="HTTP address of the Prometheus /metrics endpoint ('' = off)",
    )
    parser.add_argument(
        "--spool-dir",
        default=None,
        metavar="DIR",
        help="where points wait while InfluxDB is away (default: a temporary directory; "
        "a fixed one is replayed after a restart)",
    )
    parser.add_argument(
        "--spool-bytes", type=int, default=1 << 30, metavar="N", help="bound of the spool; drop-oldest beyond"
    )
    parser.add_argument(
        "--max-export-points",
        type=int,
        default=1_000_000,
        metavar="N",
        help="bound of the in-memory export queue (points)",
    )
    add_secret_argument(
        parser,
        "dispatcher-token",
        TOKEN_ENV,
        "the token for the dispatcher's user API (a viewer's is enough); with TLS, --ca/--cert/--key "
        "are used toward the dispatcher too",
    )
    kafka = parser.add_argument_group(
        "Kafka", "consume the agents' records from a Kafka topic in a consumer group instead of serving gRPC"
    )
    kafka.add_argument(
        "--kafka-brokers", default=None, metavar="HOST:PORT,...", help="bootstrap brokers (turns Kafka on)"
    )
    kafka.add_argument("--kafka-topic", default="hoptrace-records", help="the records topic")
    kafka.add_argument(
        "--kafka-group", default="hoptrace-collectors", help="consumer group of the collectors"
    )
    kafka.add_argument(
        "--kafka-session-timeout-ms",
        type=int,
        default=10_000,
        metavar="MS",
        help="how long the group waits for a silent collector before moving its partitions",
    )
    kafka.add_argument(
        "--kafka-security-protocol",
        default="PLAINTEXT",
        choices=["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"],
        help="toward the brokers (production: SSL or SASL_SSL)",
    )
    kafka.add_argument("--kafka-ca", default=None, metavar="PEM", help="CA of the brokers' certificates")
    kafka.add_argument("--kafka-cert", default=None, metavar="PEM", help="client certificate, if brokers ask")
    kafka.add_argument("--kafka-key", default=None, metavar="PEM", help="its private key")
    kafka.add_argument(
        "--kafka-sasl-mechanism", default=None, choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    )
    kafka.add_argument("--kafka-sasl-user", default=None)
    kafka.add_argument(
        "--kafka-sasl-password-file", default=None, metavar="FILE", help="the SASL password (never inline)"
    )
    parser.add_argument(
        "--exemplar-slowest",
        type=int,
        default=AggregateConfig.exemplar_slowest,
        metavar="K",
        help="per trace and second, write the K slowest packets one point per segment (hop_latency)",
    )
    parser.add_argument(
        "--exemplar-every",
        type=int,
        default=AggregateConfig.exemplar_every,
        metavar="N",
        help="also write every packet whose ID is a multiple of N (1 = every packet, 0 = none)",
    )
    parser.add_argument(
        "--capture-budget",
        type=int,
        default=CaptureConfig.per_trace_per_s,
        metavar="N",
        help="per trace and second, write at most N captured packets (hop_capture; the rest are dropped"
        " and counted)",
    )
    parser.add_argument(
        "--instance",
        default=None,
        metavar="NAME",
        help="this collector's name, the `collector` tag of its windows (default: HOSTNAME:PORT of --listen, "
        "so collectors on one host differ); keep it across restarts so that a replay overwrites instead of "
        "adding",
    )
    otlp = parser.add_argument_group(
        "OpenTelemetry",
        "also export exemplar packets as traces and segment latency as histograms (docs/otel.md)",
    )
    otlp.add_argument(
        "--otlp-endpoint", default="", metavar="HOST:PORT", help="OTLP/gRPC receiver (turns it on)"
    )
    otlp.add_argument("--otlp-insecure", action="store_true", help="plaintext toward it (default: TLS)")
    otlp.add_argument(
        "--otlp-ca", default=None, metavar="PEM", help="CA of its certificate (default: system's)"
    )
    otlp.add_argument("--otlp-cert", default=None, metavar="PEM", help="client certificate, if it asks")
    otlp.add_argument("--otlp-key", default=None, metavar="PEM", help="its private key")
    otlp.add_argument(
        "--otlp-sample",
        default="slowest",
        metavar="slowest|1/N|all",
        help="which exemplar packets become traces: the slowest per trace and window (--exemplar-slowest), "
        "1 in N by ID (N a multiple of --exemplar-every), or every exemplar",
    )
    otlp.add_argument(
        "--otlp-drops",
        action="store_true",
        help="also every lost packet whose drop was recorded (a trace with drops: true), exemplar or not",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    add_server_tls_arguments(parser)


def default_instance(listen: str) -> str:
    """The host name and the gRPC port of `listen` (HOST:PORT): distinct for collectors sharing a host, the
    same after a restart on the same address. An ephemeral port (0) leaves just the host name."""
    port = listen.rsplit(":", 1)[-1] if ":" in listen else ""
    host = socket.gethostname()
    return f"{host}:{port}" if port and port != "0" else host


def run(args: argparse.Namespace) -> int:
    """Run the collector with parsed `args` until SIGTERM/SIGINT; returns the exit status."""
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO))
    try:
        tls = server_tls_from_args(args)
        aggregate = AggregateConfig(
            exemplar_slowest=args.exemplar_slowest, exemplar_every=args.exemplar_every
        )
        aggregate.instance = args.instance if args.instance is not None else default_instance(args.listen)
        aggregate.validate()
        capture = CaptureConfig(per_trace_per_s=args.capture_budget)
        capture.validate()
        otlp = OtlpConfig(
            endpoint=args.otlp_endpoint,
            insecure=args.otlp_insecure,
            ca=args.otlp_ca,
            cert=args.otlp_cert,
            key=args.otlp_key,
            sample=args.otlp_sample,
            drops=args.otlp_drops,
        )
        otlp.validate(aggregate.exemplar_every, aggregate.exemplar_slowest)
        if args.clock_key_file:
            read_key_file(args.clock_key_file)
    except (ValueError, OSError) as error:
        print(f"hoptrace collector: {error}", file=sys.stderr)
        return 2
    kafka: KafkaConfig | None = None
    if args.kafka_brokers:
        try:
            kafka = KafkaConfig(
                brokers=args.kafka_brokers,
                topic=args.kafka_topic,
                group=args.kafka_group,
                session_timeout_ms=args.kafka_session_timeout_ms,
                security_protocol=args.kafka_security_protocol,
                ssl_ca=args.kafka_ca,
                ssl_cert=args.kafka_cert,
                ssl_key=args.kafka_key,
                sasl_mechanism=args.kafka_sasl_mechanism,
                sasl_user=args.kafka_sasl_user,
                sasl_password=read_secret_file(args.kafka_sasl_password_file),
            )
            kafka.validate()
        except (ValueError, OSError) as error:
            print(f"hoptrace collector: {error}", file=sys.stderr)
            return 2
    catalog = TraceCatalog()
    stop_sync = threading.Event()
    if args.dispatcher:
        token = secret_from(args, "dispatcher-token", TOKEN_ENV) or None
        address = args.dispatcher

        def channel() -> grpc.Channel:
            if tls is None:
                return api_channel(address, token=token, insecure=True)
            return api_channel(address, ca=tls.ca, cert=tls.cert, key=tls.key, token=token)

        follow_dispatcher(catalog, args.dispatcher, stop_sync, channel=channel)
    try:
        return run_collector(
            args.listen,
            args.influx_url,
            args.influx_bucket,
            args.influx_org,
            secret_from(args, "influx-token", INFLUX_TOKEN_ENV),
            catalog=catalog,
            catalog_file=args.traces,
            join_window_s=args.join_window,
            max_entries=args.max_pending,
            clock_listen=args.clock_listen,
            clock_key_file=args.clock_key_file,
            clock_key_rotate_s=args.clock_key_rotate,
            metrics_listen=args.metrics_listen,
            spool_dir=args.spool_dir,
            spool_bytes=args.spool_bytes,
            max_export_points=args.max_export_points,
            tls=tls,
            kafka=kafka,
            aggregate=aggregate,
            otlp=otlp,
            capture=capture,
        )
    finally:
        stop_sync.set()


def run_collector(
    listen: str,
    influx_url: str,
    influx_bucket: str,
    influx_org: str = "-",
    influx_token: str = "",
    *,
    catalog: TraceCatalog | None = None,
    catalog_file: str | None = None,
    join_window_s: float = 2.0,
    max_entries: int = 500_000,
    stop_event: threading.Event | None = None,
    clock_listen: str | None = "127.0.0.1:7123",
    clock_key_file: str | None = None,
    clock_key_rotate_s: float = 3600.0,
    metrics_listen: str | None = "127.0.0.1:9171",
    spool_dir: str | None = None,
    spool_bytes: int = 1 << 30,
    max_export_points: int = 1_000_000,
    tls: TLSFiles | None = None,
    kafka: Any = None,
    aggregate: AggregateConfig | None = None,
    otlp: OtlpConfig | None = None,
    capture: CaptureConfig | None = None,
) -> int:
    """Run the collector until SIGTERM/SIGINT (or `stop_event`), then flush everything. Returns 0.

    With `kafka` (a `hoptrace.collector.kafka.KafkaConfig`) it consumes the records topic in a consumer
    group instead of serving gRPC on `listen`."""
    config = CollectorConfig(
        receiver=ReceiverConfig(listen=listen, tls=tls),
        join=JoinConfig(window_ns=int(join_window_s * 1e9), max_entries=max_entries),
        aggregate=aggregate or AggregateConfig(),
        influx=InfluxConfig(
            url=influx_url,
            bucket=influx_bucket,
            org=influx_org,
            token=influx_token,
            spool_dir=spool_dir,
            spool_bytes=spool_bytes,
            max_pending=max_export_points,
        ),
        catalog_file=catalog_file,
        clock_listen=clock_listen or None,
        clock_key_file=clock_key_file,
        clock_key_rotate_s=clock_key_rotate_s,
        metrics_listen=metrics_listen or None,
        otlp=otlp or OtlpConfig(),
        capture=capture or CaptureConfig(),
    )
    stop = stop_event or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    service: Any
    if kafka is not None:
        service = KafkaCollectorService(config, kafka, catalog)
    else:
        service = start_collector(config, catalog)
    try:
        while not stop.wait(0.5):  # short waits keep the main thread responsive to signals
            pass
    finally:
        service.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run the collector."""
    parser = ArgumentParser(prog="hoptrace collector", description="receive records, write InfluxDB")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_command(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
