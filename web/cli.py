"""`hoptrace web`: serve the web UI. Flags only here (no Flask import) so `hoptrace --help` stays fast."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_LISTEN = "127.0.0.1:7080"
DEV_USER = ("admin", "admin")
SECRET_KEY_ENV = "HOPTRACE_WEB_SECRET_KEY"  # the app reads it too (HOPTRACE_WEB_ prefixed settings)

log = logging.getLogger("hoptrace.web")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `hoptrace web`. The dispatcher connection's flags (--dispatcher, --ca/--cert/--key, --token,
    --insecure) are the API client's, shared with the other client commands; for the web UI, --insecure
    (plaintext to a dispatcher started with --insecure) also allows the development login admin/admin
    and a random session key."""
    parser.add_argument("--listen", default=DEFAULT_LISTEN, help=f"HTTP address (default {DEFAULT_LISTEN})")
    parser.add_argument(
        "--users-file",
        default=os.environ.get("HOPTRACE_WEB_USERS_FILE"),
        help="lines USER:PASSWORD_HASH (werkzeug generate_password_hash); default $HOPTRACE_WEB_USERS_FILE",
    )
    from hoptrace.common.grpcutil import add_secret_argument

    add_secret_argument(parser, "secret-key", SECRET_KEY_ENV, "the session signing key")
    parser.add_argument(
        "--behind-https-proxy",
        action="store_true",
        help="served through a TLS-terminating reverse proxy: Secure session cookies, X-Forwarded-* trusted",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")


def read_users_file(path: str) -> dict[str, str]:
    """USER:HASH lines (blank lines and # comments ignored)."""
    users = {}
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"--users-file {path}: {error.strerror or error}") from None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password_hash = line.partition(":")
        if not sep or not user or not password_hash:
            raise ValueError(f"{path}:{number}: expected USER:PASSWORD_HASH")
        users[user] = password_hash
    return users


def channel_factory(args: argparse.Namespace):  # noqa: ANN201 - Callable[[], grpc.Channel]
    """Makes the dispatcher channel the way every API client does: mutual TLS (--ca/--cert/--key) and the
    token, or plaintext with --insecure."""
    from hoptrace.common.grpcutil import TOKEN_ENV, api_channel, secret_from

    def make():  # noqa: ANN202
        return api_channel(
            args.dispatcher,
            ca=getattr(args, "ca", None),
            cert=getattr(args, "cert", None),
            key=getattr(args, "key", None),
            token=secret_from(args, "token", TOKEN_ENV) or None,
            insecure=bool(getattr(args, "insecure", False)),
        )

    make()  # fail at start (missing CA, unreadable key), not on the first page view
    return make


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The app configuration for parsed flags; raises ValueError when the setup is not safe to serve."""
    from werkzeug.security import generate_password_hash

    from hoptrace.common.grpcutil import secret_from

    insecure = bool(getattr(args, "insecure", False))
    config: dict[str, Any] = {
        "DISPATCHER": args.dispatcher,
        "DISPATCHER_CHANNEL_FACTORY": channel_factory(args),
        "BEHIND_HTTPS_PROXY": bool(getattr(args, "behind_https_proxy", False)),
    }
    users: dict[str, str] = {}
    if os.environ.get("HOPTRACE_WEB_USERS"):
        users.update(json.loads(os.environ["HOPTRACE_WEB_USERS"]))
    if args.users_file:
        users.update(read_users_file(args.users_file))
    if not users:
        if not insecure:
            raise ValueError(
                "no users: give --users-file (lines USER:HASH) or $HOPTRACE_WEB_USERS, "
                "or --insecure for a development login admin/admin"
            )
        users = {DEV_USER[0]: generate_password_hash(DEV_USER[1])}
        log.warning("--insecure: development login %s/%s", *DEV_USER)
    config["USERS"] = users
    if args.secret_key_file:
        config["SECRET_KEY"] = secret_from(args, "secret-key", SECRET_KEY_ENV)
    elif not os.environ.get(SECRET_KEY_ENV) and not insecure:
        raise ValueError("no session key: give --secret-key-file or $HOPTRACE_WEB_SECRET_KEY (or --insecure)")
    return config


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (a threaded WSGI server: the results page polls while forms post)."""
    import signal

    from werkzeug.serving import make_server

    from hoptrace.web import create_app

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = config_from_args(args)
    except (ValueError, OSError) as error:
        print(f"error: web: {error}", file=sys.stderr)
        return 1
    host, _, port = args.listen.rpartition(":")
    app = create_app(config)
    try:
        server = make_server(host.strip("[]") or "127.0.0.1", int(port), app, threaded=True)
    except (OSError, ValueError) as error:
        print(f"error: web: cannot listen on {args.listen}: {error}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: object) -> None:
        log.info("signal %d: stopping", signum)
        import threading

        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("web UI on http://%s (dispatcher %s)", args.listen, args.dispatcher)
    server.serve_forever()
    return 0
