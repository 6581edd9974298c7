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

    wrong = run_cli(servers, {**env, TOKEN_ENV: "ht_not-a-token"}, "trace", "ls")
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


def test_roles_limit_what_a_token_may_do(servers: LocalCluster, certs: CertBundle, tmp_path):
    """Any valid token with any CA-signed certificate once could apply, delete and run presets.
    A viewer reads; an operator also applies; the collector's certificate only reads, whatever its token."""
    env = servers.client_env()
    viewer = add_token(certs.tokens, "view-only", "viewer")
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: roles\nhops:\n  - {name: a, node: nowhere, at: tc-egress, dev: eth0}\n")

    listed = run_cli(servers, {**env, TOKEN_ENV: viewer}, "trace", "ls")
    assert listed.returncode == 0, listed.stderr
    applied = run_cli(servers, {**env, TOKEN_ENV: viewer}, "trace", "apply", "-f", str(spec))
    assert applied.returncode == 1
    assert "token 'view-only' has role viewer; ApplyTrace needs operator" in applied.stderr, applied.stderr
    preset = run_cli(servers, {**env, TOKEN_ENV: viewer}, "iron", "--node", "sec-a", "--duration", "1")
    assert preset.returncode == 1 and "RunPreset needs operator" in preset.stderr, preset.stderr

    # the collector's certificate with the admin's token: still only a reader
    collector = certs.files("collector")
    as_collector = {**env, "HOPTRACE_CERT": str(collector.cert), "HOPTRACE_KEY": str(collector.key)}
    reads = run_cli(servers, as_collector, "trace", "ls")
    assert reads.returncode == 0, reads.stderr
    writes = run_cli(servers, as_collector, "trace", "apply", "-f", str(spec))
    assert writes.returncode == 1
    assert "has role 'collector', which may not call ApplyTrace" in writes.stderr, writes.stderr


def test_tokens_never_travel_on_the_command_line(servers: LocalCluster, certs: CertBundle):
    """Tokens were once passed as --token/--dispatcher-token values, readable in /proc/PID/cmdline.
    Clients take --token-file or $HOPTRACE_TOKEN; the cluster's collector and web get files."""
    env = {k: v for k, v in servers.client_env().items() if k != TOKEN_ENV}
    by_file = run_cli(servers, env, "trace", "ls", "--token-file", str(certs.out / "admin.token"))
    assert by_file.returncode == 0, by_file.stderr
    on_argv = run_cli(servers, env, "trace", "ls", "--token", certs.token("admin"))
    assert on_argv.returncode == 2 and "--token is not taken on the command line" in on_argv.stderr
    assert certs.token("admin") not in on_argv.stderr
    for component in servers.components.values():
        with open(f"/proc/{component.process.pid}/cmdline", "rb") as cmdline:
            text = cmdline.read().decode(errors="replace")
        for name in ("admin", "web", "collector"):
            assert certs.token(name) not in text, f"{component.name} has the {name} token on its command line"
