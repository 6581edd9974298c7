"""The web UI's connection to the dispatcher: one `hoptrace.common.client.ApiClient` per app."""

from __future__ import annotations

import grpc
from flask import Flask, current_app, g, has_request_context

from hoptrace.common.client import ApiClient, ApiError
from hoptrace.common.grpcutil import ON_BEHALF_OF_HEADER


def acting_user() -> list[tuple[str, str]]:
    """The logged-in user of the request a call is made for, as call metadata: the dispatcher's audit trail
    names them beside the web's token."""
    user = g.get("user") if has_request_context() else None
    return [(ON_BEHALF_OF_HEADER, user)] if user else []


def init_app(app: Flask) -> None:
    """Attach an ApiClient for the configured address to `app`."""
    app.extensions["hoptrace_dispatcher"] = ApiClient(
        app.config["DISPATCHER"], app.config.get("DISPATCHER_CHANNEL_FACTORY"), metadata=acting_user
    )


def get_client() -> ApiClient:
    """The current app's ApiClient."""
    return current_app.extensions["hoptrace_dispatcher"]


def http_status(error: ApiError) -> int:
    """The page's status for a failed call: 404 for what does not exist (a mistyped trace name), 400 for a
    request the dispatcher refused as it was asked (an end before its start), 502 for a dispatcher or store
    that could not answer."""
    if error.code == grpc.StatusCode.NOT_FOUND:
        return 404
    return 400 if error.code == grpc.StatusCode.INVALID_ARGUMENT else 502
