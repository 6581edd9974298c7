"""A certificate, key, CA file or token that cannot work is named with its cause in one line, before gRPC
reads it: a client certificate of another CA or expired once gave only "Socket closed", a key of another
certificate or a CA file that is not PEM gave library noise and then "empty address list", a token with a
trailing space "Illegal metadata"."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from hoptrace.common.certs import create_bundle
from hoptrace.common.grpcutil import TOKEN_ENV, api_channel, secret_from
from hoptrace.common.tlscheck import TLSFileError, check_tls_files

pytestmark = pytest.mark.unit  # no root, no server: make test-unit runs it without root


def cli(*args: str) -> list[str]:
    """argv of the `hoptrace` CLI with this interpreter's site directories only (as test_cli_output)."""
    sites = [path for path in sys.path if path.endswith("site-packages")]
    code = (
        f"import site, sys; [site.addsitedir(p) for p in {sites!r}]; "
        "from hoptrace.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    return [sys.executable, "-S", "-c", code, *args]


def agents_with(
    ca: Path, cert: Path, key: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`hoptrace agents` with these files, toward a port nothing listens on: the files are checked first."""
    return subprocess.run(
        cli("agents", "--dispatcher", "127.0.0.1:9", "--ca", str(ca), "--cert", str(cert), "--key", str(key)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def expired_copy(bundle: Path, name: str, out: Path) -> Path:
    """`name`.pem reissued by the bundle's CA with a validity that ended yesterday."""
    ca_cert = x509.load_pem_x509_certificate((bundle / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((bundle / "ca.key").read_bytes(), password=None)
    original = x509.load_pem_x509_certificate((bundle / f"{name}.pem").read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(original.subject)
        .issuer_name(ca_cert.subject)
        .public_key(original.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=30))
        .not_valid_after(now - datetime.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    path = out / f"{name}-expired.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture
def bundles(tmp_path: Path) -> tuple[Path, Path]:
    """Two `hoptrace certs` directories: two CAs."""
    one, other = tmp_path / "one", tmp_path / "other"
    create_bundle(one)
    create_bundle(other)
    return one, other


def test_good_files_pass(bundles: tuple[Path, Path]) -> None:
    one, _ = bundles
    check_tls_files(one / "ca.pem", one / "admin.pem", one / "admin.key")


def test_each_bad_file_is_named_with_its_cause(bundles: tuple[Path, Path], tmp_path: Path) -> None:
    one, other = bundles
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("this is not a certificate\n")
    cases = {
        "another CA": (one / "ca.pem", other / "admin.pem", other / "admin.key"),
        "expired": (one / "ca.pem", expired_copy(one, "admin", tmp_path), one / "admin.key"),
        "key of another certificate": (one / "ca.pem", one / "admin.pem", one / "web.key"),
        "CA not PEM": (not_pem, one / "admin.pem", one / "admin.key"),
        "missing key": (one / "ca.pem", one / "admin.pem", tmp_path / "absent.key"),
    }
    expected = {
        "another CA": f"certificate {other / 'admin.pem'} was not issued by the CA in {one / 'ca.pem'}",
        "expired": f"certificate {tmp_path / 'admin-expired.pem'} expired on ",
        "key of another certificate": f"key {one / 'web.key'} is not the key of certificate "
        f"{one / 'admin.pem'}",
        "CA not PEM": f"CA file {not_pem} holds no PEM certificate",
        "missing key": f"key {tmp_path / 'absent.key'}: No such file or directory",
    }
    for case, files in cases.items():
        with pytest.raises(TLSFileError) as raised:
            check_tls_files(*files)
        assert expected[case] in str(raised.value), (case, str(raised.value))
        run = agents_with(*files)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 1, (case, run.returncode, run.stderr)
        assert len(lines) == 1 and expected[case] in lines[0], (case, run.stderr)
        assert "Traceback" not in run.stderr and "empty address list" not in run.stderr


def test_a_token_is_one_printable_word(monkeypatch: pytest.MonkeyPatch, bundles: tuple[Path, Path]) -> None:
    class Args:
        token_file = None

    monkeypatch.setenv(TOKEN_ENV, "s3cret-token \n")
    assert secret_from(Args(), "token", TOKEN_ENV) == "s3cret-token"
    api_channel("127.0.0.1:9", token="s3cret-token", insecure=True).close()
    with pytest.raises(ValueError, match=r"the API token .* holds whitespace"):
        api_channel("127.0.0.1:9", token="s3cret token", insecure=True)
    one, _ = bundles
    run = agents_with(one / "ca.pem", one / "admin.pem", one / "admin.key", env={TOKEN_ENV: "two words"})
    assert run.returncode == 1 and "holds whitespace" in run.stderr and "Illegal metadata" not in run.stderr
    assert "two words" not in run.stderr  # never echo a secret
