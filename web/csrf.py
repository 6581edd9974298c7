"""CSRF protection: a random token in the (signed) session, required on every state-changing request.

Forms carry it as the hidden field `csrf_token`; scripts send it in the `X-CSRF-Token` header. A request
without it, or with another session's, is refused with 400 before any view runs.
"""

from __future__ import annotations

import hmac
import secrets

from flask import Flask, abort, request, session

SESSION_KEY = "_csrf_token"
FORM_FIELD = "csrf_token"
HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def csrf_token() -> str:
    """This session's token, created on first use (templates call it as `csrf_token()`)."""
    token = session.get(SESSION_KEY)
    if not token:
        token = secrets.token_urlsafe(32)
        session[SESSION_KEY] = token
    return token


def rotate_token() -> str:
    """A new token for the session (after login, so a token seen before it is useless)."""
    session.pop(SESSION_KEY, None)
    return csrf_token()


def check_csrf() -> None:
    """Refuse (400) a state-changing request whose token is missing or not this session's."""
    if request.method in SAFE_METHODS:
        return
    expected = session.get(SESSION_KEY)
    sent = request.form.get(FORM_FIELD) or request.headers.get(HEADER)
    if not expected or not sent or not hmac.compare_digest(str(sent), str(expected)):
        abort(400, description="CSRF token missing or invalid: reload the page and try again.")


def init_app(app: Flask) -> None:
    """Check every request and make `csrf_token()` available to templates."""
    app.before_request(check_csrf)
    app.jinja_env.globals["csrf_token"] = csrf_token
