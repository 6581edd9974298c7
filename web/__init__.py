"""hoptrace.web: the operator UI (Flask). Agents, traces (form and YAML), per-hop results, presets, audit.

The UI is a client of the dispatcher's user API (`hoptrace.v1.Hoptrace` over gRPC): every spec check it shows
is the dispatcher's own (`ValidateTrace`), every change goes through `ApplyTrace`/`DeleteTrace`, and results
come from `GetReport`: the web UI has no database connection of its own.

Configuration (defaults below; `HOPTRACE_WEB_<KEY>` environment variables override them, JSON-parsed when
they parse, e.g. ``HOPTRACE_WEB_USERS='{"alice": "scrypt:..."}'``; `test_config` overrides both).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from flask import Flask, Response, redirect, url_for
from werkzeug.middleware.proxy_fix import ProxyFix

WEB_DIR = Path(__file__).resolve().parent

DEFAULTS: dict[str, Any] = {
    # HOST:PORT of the dispatcher's user API.
    "DISPATCHER": "127.0.0.1:7070",
    # A callable returning the grpc.Channel to the dispatcher (mutual TLS + API token: `hoptrace web` builds
    # it with hoptrace.common.grpcutil.api_channel); None: plaintext to DISPATCHER.
    "DISPATCHER_CHANNEL_FACTORY": None,
    # username -> password hash (werkzeug.security.generate_password_hash).
    "USERS": {},
    # Default time range of the results page, and how often it polls while the trace runs.
    "RESULTS_SINCE": "15m",
    "POLL_INTERVAL_MS": 2000,
    # Failed logins allowed per client address and per username (Flask-Limiter syntax).
    "LOGIN_RATE_LIMIT": "10 per minute",
    # Served behind a TLS-terminating reverse proxy: Secure cookies, the proxy's X-Forwarded-* trusted.
    "BEHIND_HTTPS_PROXY": False,
    # Where `npm ci --prefix web` put the chart library.
    "NODE_MODULES": str(WEB_DIR / "node_modules"),
    "SESSION_COOKIE_SAMESITE": "Lax",
    "SESSION_COOKIE_HTTPONLY": True,
}


# Scripts and styles only from this site (Chart.js and results.js are files; templates set inline style
# attributes, hence 'unsafe-inline' for styles only); no framing, no MIME sniffing.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)


def security_headers(response: Response) -> Response:
    """The headers every answer carries."""
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


def create_app(test_config: dict[str, Any] | None = None) -> Flask:
    """The application factory: configuration, then one blueprint per feature."""
    app = Flask(__name__, template_folder="templates", static_folder="static")
    app.config.from_mapping(DEFAULTS)
    app.config.from_prefixed_env("HOPTRACE_WEB")
    if test_config is not None:
        app.config.from_mapping(test_config)
    if not app.config.get("SECRET_KEY"):
        # Sessions then last as long as the process; `hoptrace web` requires a key unless --insecure.
        app.config["SECRET_KEY"] = secrets.token_hex(32)

    from hoptrace.web import agents, audit, auth, csrf, dispatcher, packets, presets, results, traces

    dispatcher.init_app(app)
    auth.init_app(app)  # before csrf: an anonymous POST is sent to the login page, not refused
    csrf.init_app(app)
    app.register_blueprint(auth.bp)
    auth.limit_logins(app)
    app.register_blueprint(agents.bp)
    app.register_blueprint(traces.bp)
    app.register_blueprint(results.bp)
    app.register_blueprint(packets.bp)
    app.register_blueprint(presets.bp)
    app.register_blueprint(audit.bp)
    app.jinja_env.filters["ns"] = results.format_ns
    app.after_request(security_headers)
    if app.config["BEHIND_HTTPS_PROXY"]:
        # The proxy terminates TLS: trust its X-Forwarded-Proto/-For (one hop), send cookies only over HTTPS.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1, x_proto=1)  # type: ignore[method-assign]
        app.config["SESSION_COOKIE_SECURE"] = True

    @app.get("/")
    def index():  # noqa: ANN202 - a view
        return redirect(url_for("traces.index"))

    return app
