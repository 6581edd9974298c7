"""The Kafka stage's pure parts: its configuration, and the deduper that makes a replay overwrite itself."""

from __future__ import annotations

import pytest

from hoptrace.collector.aggregate import LatencySample
from hoptrace.collector.kafka import KafkaConfig, ReplayDeduper, parse_written_before
from hoptrace.collector.points import Point, latency_point

pytestmark = pytest.mark.unit


def sample(ts: int, packet_id: int) -> Point:
    return latency_point(LatencySample("t", "a>b", "a", "b", "n1", "n2", ts, 100, packet_id, False))


def test_replayed_packet_keeps_its_timestamp_collisions_still_move() -> None:
    d = ReplayDeduper(horizon_ns=10_000)
    first = [d.unique(sample(1000, 1)), d.unique(sample(1000, 2)), d.unique(sample(2000, 3))]
    assert first == [1000, 1001, 2000]  # packet 2 collided with 1 at 1000 ns: moved on
    again = [d.unique(sample(1000, 2)), d.unique(sample(1000, 1)), d.unique(sample(2000, 3))]
    assert again == [1001, 1000, 2000] and d.replayed == 3  # a replay lands on the same points
    assert d.unique(sample(1000, 4)) == 1002  # a new packet at a used time still moves
    assert d.unique(sample(50_000, 5)) == 50_000  # far ahead: the old times are forgotten (bounded memory)
    assert d.unique(sample(1000, 6)) == 1000


def test_kafka_config_validate() -> None:
    KafkaConfig(brokers="b:9092").validate()
    KafkaConfig(
        brokers="b:9093", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_user="u"
    ).validate()
    for bad in (
        KafkaConfig(brokers=""),
        KafkaConfig(brokers="b:9092", security_protocol="TLS"),
        KafkaConfig(brokers="b:9092", security_protocol="SASL_SSL"),
        KafkaConfig(brokers="b:9092", ssl_cert="c.pem"),
        KafkaConfig(brokers="b:9092", session_timeout_ms=10),
    ):
        with pytest.raises(ValueError):
            bad.validate()
    conf = KafkaConfig(
        brokers="b:9092", group="g", ssl_ca="ca.pem", security_protocol="SSL"
    ).consumer_config()
    assert (
        conf["enable.auto.commit"] is False
        and conf["group.id"] == "g"
        and conf["ssl.ca.location"] == "ca.pem"
    )
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"


def test_commit_metadata_written_before() -> None:
    assert parse_written_before("written-before-ns=1700000000000000000") == 1_700_000_000_000_000_000
    # no metadata (a commit of an older collector) or someone else's: resume from nothing written
    for other in (None, "", "written-before-ns=x", "offsets by another tool"):
        assert parse_written_before(other) == 0
