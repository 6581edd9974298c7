"""Login: users and their password hashes come from the configuration (`USERS`); every page but /login,
the static files and the chart library requires a logged-in session."""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Blueprint, Flask, flash, g, redirect, render_template, request, session, url_for
from werkzeug.security import check_password_hash, generate_password_hash

from hoptrace.web.csrf import rotate_token

bp = Blueprint("auth", __name__)

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


def load_user() -> None:
    """g.user is the logged-in username (or None); anonymous requests to private pages go to /login."""
    username = session.get("user")
    g.user = username if username in _users() else None
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
    from flask import current_app

    return current_app.config.get("USERS") or {}


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
            session.clear()
            session["user"] = username
            rotate_token()
            return redirect(target)
        else:
            error = "Wrong username or password."
    return render_template("login.html", error=error), 401 if error else 200


@bp.post("/logout")
def logout():  # noqa: ANN201 - a view
    """End the session."""
    session.clear()
    flash("Logged out.")
    return redirect(url_for("auth.login"))


def init_app(app: Flask) -> None:
    """Require login on every request (registered before the CSRF check)."""
    app.before_request(load_user)
