"""Audit page: the dispatcher's audit trail, newest first: who applied and deleted which trace and ran which
preset or discovery (the web UI's own users named beside its token), when, and how it ended."""

from __future__ import annotations

from flask import Blueprint, render_template, request

from hoptrace.common.client import ApiError
from hoptrace.results.audit_view import audit_data
from hoptrace.web.dispatcher import get_client, http_status

bp = Blueprint("audit", __name__, url_prefix="/audit")
# The newest entries the page shows.
PAGE_ENTRIES = 200


@bp.get("/")
def index():  # noqa: ANN201 - a view
    """The newest PAGE_ENTRIES entries, of one trace with ?trace=NAME."""
    trace = request.args.get("trace", "")
    try:
        entries = get_client().audit(PAGE_ENTRIES, trace)
    except ApiError as error:
        return render_template("audit.html", entries=[], trace=trace, error=error.message), http_status(error)
    views = [audit_data(entry) for entry in reversed(entries)]
    return render_template("audit.html", entries=views, trace=trace, error=None)
