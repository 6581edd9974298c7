"""Fixtures of the security tests: certificate bundles of two unrelated CAs, a secure cluster's servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hoptrace.common.certs import CertBundle, create_bundle
from hoptrace.lab.localcluster import LocalCluster


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertBundle:
    """The cluster's CA and certificates (agents sec-a, sec-b), with tokens."""
    return create_bundle(tmp_path_factory.mktemp("certs"), agents=["sec-a", "sec-b"])


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> CertBundle:
    """Certificates of another CA, with the same names (an attacker's own PKI)."""
    return create_bundle(tmp_path_factory.mktemp("foreign"), agents=["sec-a"])


@pytest.fixture(scope="module")
def servers(influxd, certs: CertBundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A dispatcher and a collector with mutual TLS and tokens (LocalCluster's defaults), no agents yet."""
    cluster = LocalCluster(influx_url=influxd.url, workdir=tmp_path_factory.mktemp("cluster"), certs=certs)
    try:
        cluster.start_dispatcher()
        cluster.start_collector()
        cluster.wait_listening()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A per-test scratch directory (agent logs, objects)."""
    return tmp_path
