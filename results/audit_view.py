"""The audit trail as its readers show it: one view of an `AuditEntry` (`audit_data`), used by
`hoptrace audit` (its table and --json) and the web UI's audit page alike."""

from __future__ import annotations

from typing import Any

from hoptrace.results.format import timestamp_text
from hoptrace.v1 import api_pb2

AUDIT_HEADER = ["TIME", "ACTION", "WHO", "ROLE", "CERTIFICATE", "TRACE", "GENERATION", "OUTCOME"]


def who_text(entry: api_pb2.AuditEntry) -> str:
    """Who did it: the user the client acted for and through which token ("alice via web"), else the token,
    else the client certificate ("-" when the dispatcher knew none)."""
    if entry.on_behalf_of:
        return f"{entry.on_behalf_of} via {entry.token or entry.certificate or '?'}"
    return entry.token or entry.certificate or "-"


def audit_data(entry: api_pb2.AuditEntry) -> dict[str, Any]:
    """One entry as `hoptrace audit --json` prints it and the web page shows it; `who` and `subject` (the
    trace, or the preset and its nodes) are the texts of the table's cells."""
    subject = entry.trace or entry.preset
    if entry.preset and entry.nodes:
        subject = f"{entry.preset} on {', '.join(entry.nodes)}"
    return {
        "at": timestamp_text(entry.at),
        "action": entry.action,
        "who": who_text(entry),
        "token": entry.token,
        "token_role": entry.token_role,
        "certificate": entry.certificate,
        "certificate_role": entry.certificate_role,
        "on_behalf_of": entry.on_behalf_of,
        "peer": entry.peer,
        "trace": entry.trace,
        "generation": entry.generation,
        "preset": entry.preset,
        "nodes": list(entry.nodes),
        "subject": subject,
        "outcome": entry.outcome,
        "error": entry.error,
    }


def audit_rows(entries: list[api_pb2.AuditEntry]) -> list[list[str]]:
    """The table of `hoptrace audit`: the header, then a row per entry; a failure's first line follows its
    row, indented."""
    rows = [AUDIT_HEADER]
    for entry in entries:
        data = audit_data(entry)
        certificate = f"{data['certificate']} ({data['certificate_role']})" if data["certificate"] else "-"
        rows.append(
            [
                data["at"],
                data["action"],
                data["who"],
                data["token_role"] or "-",
                certificate,
                data["subject"] or "-",
                str(data["generation"] or "-"),
                data["outcome"] + (f": {data['error'].splitlines()[0]}" if data["error"] else ""),
            ]
        )
    return rows
