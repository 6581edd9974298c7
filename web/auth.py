"""Login: users and their password hashes come from the configuration (`USERS`); every page but /login,
the static files and the chart library requires a logged-in session.

Sessions are signed cookies that also name a server-side session id: logging out forgets the id, so a
cookie copied before the logout no longer works. Failed logins are rate-limited per client address, and per
username from each address (Flask-Limiter): wrong passwords from one address lock that name there only, never
its owner elsewhere; past the limit even the right password waits, answered 429 with Retry-After.
"""

from __future__ import annotations

import secrets
import threading
import time
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    Flask,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from werkzeug.security import check_password_hash, generate_password_hash

from hoptrace.web.csrf import rotate_token

bp = Blueprint("auth", __name__)
MAX_SESSIONS = 10_000  # live logins kept; the oldest is forgotten beyond it

# Endpoints anyone may reach.
PUBLIC_ENDPOINTS = frozenset({"auth.login", "static", "results.chartjs"})
# Compared against when the user is unknown, so a wrong name takes as long as a wrong password.
_DUMMY_HASH = generate_password_hash("hoptrace-no-such-user")


def _safe_next(target: str | None) -> str:
    """`target` when it is a path on this site, else the home page (no open redirect)."""
    if not target:
        return url_for("index")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return url_for("index")
    return target


class SessionIds:
    """The ids of live logins (this process's): a session cookie counts only while its id is here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, str] = {}  # id -> username, oldest first

    def new(self, username: str) -> str:
        """A fresh id for `username`'s new login."""
        sid = secrets.token_urlsafe(24)
        with self._lock:
            self._ids[sid] = username
            while len(self._ids) > MAX_SESSIONS:
                self._ids.pop(next(iter(self._ids)))
        return sid

    def user_of(self, sid: object) -> str | None:
        """The username of a live id, or None."""
        with self._lock:
            return self._ids.get(sid) if isinstance(sid, str) else None

    def end(self, sid: object) -> None:
        """Forget an id (logout)."""
        with self._lock:
            if isinstance(sid, str):
                self._ids.pop(sid, None)


def _sessions() -> SessionIds:
    return current_app.extensions["hoptrace_sessions"]


def load_user() -> None:
    """g.user is the logged-in username (or None); anonymous requests to private pages go to /login."""
    username = session.get("user")
    live = _sessions().user_of(session.get("sid")) == username
    g.user = username if live and username in _users() else None
    if g.user is None and request.endpoint not in PUBLIC_ENDPOINTS:
        if request.endpoint is None:
            return  # 404s stay 404s
        if request.accept_mimetypes.best == "application/json" or request.path.endswith(".json"):
            return _json_unauthorized()
        return redirect(url_for("auth.login", next=request.full_path.rstrip("?")))
    return None


def _json_unauthorized():  # noqa: ANN202 - a response
    from flask import jsonify

    return jsonify({"error": "login required"}), 401


def _users() -> dict[str, str]:
    return current_app.config.get("USERS") or {}


def _failed(response) -> bool:  # noqa: ANN001 - a Flask response
    return response.status_code == 401


def _login_limit() -> str:
    return current_app.config["LOGIN_RATE_LIMIT"]


@bp.route("/login", methods=("GET", "POST"))
def login():  # noqa: ANN201 - a view
    """The login form; on success, a fresh session and back to where the user was going."""
    error = None
    if request.method == "POST":
        username = request.form.get("username", "")
        password = request.form.get("password", "")
        users = _users()
        stored = users.get(username, _DUMMY_HASH)
        if not users:
            error = "No users are configured: set USERS (see docs/operations.md)."
        elif check_password_hash(stored, password) and username in users:
            target = _safe_next(request.args.get("next"))
            _sessions().end(session.get("sid"))
            session.clear()
            session["user"] = username
            session["sid"] = _sessions().new(username)
            rotate_token()
            return redirect(target)
        else:
            error = "Wrong username or password."
    return render_template("login.html", error=error), 401 if error else 200


@bp.post("/logout")
def logout():  # noqa: ANN201 - a view
    """End the session: its id is forgotten, so the cookie is worthless even if someone kept a copy."""
    _sessions().end(session.get("sid"))
    session.clear()
    flash("Logged out.")
    return redirect(url_for("auth.login"))


def _too_many_logins(error: Exception):  # noqa: ANN202 - a response
    """429 with Retry-After (Flask-Limiter adds it to this response: headers_enabled), said in the page."""
    limiter: Limiter = current_app.extensions["hoptrace_limiter"]
    window = limiter.current_limit
    retry_s = max(1, int(window.reset_at - time.time()) + 1) if window is not None else 60
    message = f"Too many failed logins from this address; try again in {retry_s} s."
    return render_template("login.html", error=message), 429, {"Retry-After": str(retry_s)}


def init_app(app: Flask) -> None:
    """Require login on every request (registered before the CSRF check)."""
    app.extensions["hoptrace_sessions"] = SessionIds()
    app.before_request(load_user)


def limit_logins(app: Flask) -> None:
    """Count failed logins per client address, and per username from each client address, each app on its
    own (call after the blueprint is registered). Per username alone, anyone's wrong tries locked the name's
    owner out everywhere."""
    limiter = Limiter(key_func=get_remote_address, app=app, storage_uri="memory://")
    app.extensions["hoptrace_limiter"] = limiter
    by_user = limiter.limit(
        _login_limit,
        methods=["POST"],
        deduct_when=_failed,
        key_func=lambda: f"user:{request.form.get('username', '')}@{get_remote_address()}",
    )
    by_address = limiter.limit(_login_limit, methods=["POST"], deduct_when=_failed)
    app.view_functions["auth.login"] = by_address(by_user(app.view_functions["auth.login"]))
    app.register_error_handler(429, _too_many_logins)
