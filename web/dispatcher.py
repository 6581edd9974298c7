"""The web UI's connection to the dispatcher: one `hoptrace.common.client.ApiClient` per app."""

from __future__ import annotations

from flask import Flask, current_app

from hoptrace.common.client import ApiClient


def init_app(app: Flask) -> None:
    """Attach an ApiClient for the configured address to `app`."""
    app.extensions["hoptrace_dispatcher"] = ApiClient(
        app.config["DISPATCHER"], app.config.get("DISPATCHER_CHANNEL_FACTORY")
    )


def get_client() -> ApiClient:
    """The current app's ApiClient."""
    return current_app.extensions["hoptrace_dispatcher"]
