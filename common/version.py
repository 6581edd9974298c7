"""What version of hoptrace runs here, and which API it speaks: `hoptrace version` and `GetVersion`."""

from __future__ import annotations

from importlib import metadata

from hoptrace.v1 import api_pb2

# The gRPC API's package ("hoptrace.v1"): a client and a dispatcher of the same package understand each other.
API_VERSION = api_pb2.DESCRIPTOR.package


def package_version() -> str:
    """The installed hoptrace package's version (pyproject's), or "unknown" when it is not installed."""
    try:
        return metadata.version("hoptrace")
    except metadata.PackageNotFoundError:
        return "unknown"
