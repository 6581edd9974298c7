"""hoptrace.web: the operator UI (Flask). Agents, traces (form and YAML), per-hop results, presets.

The UI is a client of the dispatcher's user API (`hoptrace.v1.Hoptrace` over gRPC): every spec check it shows
is the dispatcher's own (`ValidateTrace`), every change goes through `ApplyTrace`/`DeleteTrace`. Results are
read from the collector's InfluxDB with the collector's report functions.

Configuration (defaults below; `HOPTRACE_WEB_<KEY>` environment variables override them, JSON-parsed when
they parse, e.g. ``HOPTRACE_WEB_USERS='{"alice": "scrypt:..."}'``; `test_config` overrides both).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from flask import Flask, redirect, url_for

WEB_DIR = Path(__file__).resolve().parent

DEFAULTS: dict[str, Any] = {
    # HOST:PORT of the dispatcher's user API.
    "DISPATCHER": "127.0.0.1:7070",
    # A callable returning the grpc.Channel to the dispatcher (mutual TLS + API token: `hoptrace web` builds
    # it with hoptrace.cli.grpcutil.api_channel); None: plaintext to DISPATCHER.
    "DISPATCHER_CHANNEL_FACTORY": None,
    # username -> password hash (werkzeug.security.generate_password_hash).
    "USERS": {},
    # Default time range of the results page, and how often it polls while the trace runs.
    "RESULTS_SINCE": "15m",
    "POLL_INTERVAL_MS": 2000,
    # Where `npm ci --prefix web` put the chart library.
    "NODE_MODULES": str(WEB_DIR / "node_modules"),
    "SESSION_COOKIE_SAMESITE": "Lax",
    "SESSION_COOKIE_HTTPONLY": True,
}


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

    from hoptrace.web import agents, auth, csrf, dispatcher, presets, results, traces

    dispatcher.init_app(app)
    auth.init_app(app)  # before csrf: an anonymous POST is sent to the login page, not refused
    csrf.init_app(app)
    app.register_blueprint(auth.bp)
    app.register_blueprint(agents.bp)
    app.register_blueprint(traces.bp)
    app.register_blueprint(results.bp)
    app.register_blueprint(presets.bp)
    app.jinja_env.filters["ns"] = results.format_ns

    @app.get("/")
    def index():  # noqa: ANN202 - a view
        return redirect(url_for("traces.index"))

    return app
