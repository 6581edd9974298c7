"""Bearer tokens on the user API: the CLI without a token, or with a wrong one, is refused with a clear
message and a non-zero exit; with the right token (and certificate) it works."""

from __future__ import annotations

import os
import subprocess

from hoptrace.common.certs import CertBundle
from hoptrace.common.grpcutil import CA_ENV, TOKEN_ENV, add_token
from hoptrace.lab.localcluster import HOPTRACE, LocalCluster


def run_cli(cluster: LocalCluster, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`hoptrace --dispatcher ADDR ARGS` with exactly the HOPTRACE_* variables of `env`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("HOPTRACE_")}
    return subprocess.run(
        [*HOPTRACE, "--dispatcher", cluster.dispatcher_addr, *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_needs_a_valid_token(servers: LocalCluster, certs: CertBundle):
    """No token, a wrong token, a token without a client certificate: refused; the admin token works."""
    env = servers.client_env()
    ok = run_cli(servers, env, "agents")
    assert ok.returncode == 0, ok.stderr

    missing = run_cli(servers, {k: v for k, v in env.items() if k != TOKEN_ENV}, "trace", "ls")
    assert missing.returncode == 1
    assert "the dispatcher refused the request: missing token" in missing.stderr, missing.stderr

    wrong = run_cli(servers, env, "trace", "ls", "--token", "ht_not-a-token")
    assert wrong.returncode == 1
    assert "the dispatcher refused the request: invalid token" in wrong.stderr, wrong.stderr

    no_cert = run_cli(servers, {CA_ENV: env[CA_ENV], TOKEN_ENV: env[TOKEN_ENV]}, "agents")
    assert no_cert.returncode == 1 and "cannot reach the dispatcher" in no_cert.stderr, no_cert.stderr

    plaintext = run_cli(servers, {TOKEN_ENV: env[TOKEN_ENV]}, "agents", "--insecure")
    assert plaintext.returncode == 1, plaintext.stdout


def test_token_created_later_is_accepted_without_restart(servers: LocalCluster, certs: CertBundle):
    """`hoptrace token create` appends to the dispatcher's token file, which it re-reads on change."""
    created = subprocess.run(
        [*HOPTRACE, "token", "create", "ci-bot", "--tokens", str(certs.tokens)],
        capture_output=True,
        text=True,
        check=True,
    )
    token = created.stdout.strip()
    assert token.startswith("ht_") and token not in certs.tokens.read_text()
    env = {**servers.client_env(), TOKEN_ENV: token}
    result = run_cli(servers, env, "trace", "ls")
    assert result.returncode == 0, result.stderr
    assert "no traces" in result.stdout


def test_token_names_are_unique(tmp_path):
    """A second token of the same name is refused (revoke by deleting its line)."""
    tokens = tmp_path / "tokens"
    add_token(tokens, "alice")
    try:
        add_token(tokens, "alice")
    except ValueError as error:
        assert "already has a token called 'alice'" in str(error)
    else:
        raise AssertionError("duplicate token name accepted")
    assert oct(tokens.stat().st_mode & 0o777) == "0o600"


def test_servers_need_tls_or_an_explicit_insecure(tmp_path):
    """Without --ca/--cert/--key a server refuses to start unless told --insecure, and then warns."""
    refused = subprocess.run(
        [*HOPTRACE, "dispatcher", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "TLS needs --ca, --cert and --key" in refused.stderr, refused.stderr

    process = subprocess.Popen(
        [
            *HOPTRACE,
            "dispatcher",
            "--insecure",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path / "s"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in process.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if "dispatcher listening" in line:
                break
        assert any("WARNING: dispatcher on 127.0.0.1:0 runs WITHOUT TLS" in line for line in lines), lines
    finally:
        process.terminate()
        process.wait(10)
