"""The trace spec language: load, validate and convert users' specs (filter, hops, actions, events).

One package owns the language, as tetragon's tracingpolicy does: the dispatcher, the CLI, the web UI and
the lab import it, and nothing downstream parses a user's string again (`check_spec` hands over each hop's
parsed `AttachPoint` in a `CheckedSpec`). Reference: spec/README.md.
"""

from hoptrace.spec.attach import AttachPoint, at_spelling, parse_attach_point
from hoptrace.spec.spec import (
    CheckedSpec,
    FieldError,
    SpecError,
    check_spec,
    format_errors,
    load_spec,
    spec_from_data,
    spec_to_data,
    spec_to_json,
    spec_to_yaml,
    tcp_tagging_enabled,
    udp_tagging_enabled,
    validate_filter,
    validate_spec,
)

__all__ = [
    "AttachPoint",
    "CheckedSpec",
    "FieldError",
    "SpecError",
    "at_spelling",
    "check_spec",
    "format_errors",
    "load_spec",
    "parse_attach_point",
    "spec_from_data",
    "spec_to_data",
    "spec_to_json",
    "spec_to_yaml",
    "tcp_tagging_enabled",
    "udp_tagging_enabled",
    "validate_filter",
    "validate_spec",
]
