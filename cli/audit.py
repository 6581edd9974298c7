"""``hoptrace audit``: the dispatcher's audit trail, who applied and deleted which trace and ran which preset
or discovery, when, and how it ended (docs/security.md, "Audit trail")."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hoptrace.cli.api import client_of
from hoptrace.cli.table import table
from hoptrace.results.audit_view import audit_data, audit_rows


def run_audit(args: argparse.Namespace) -> int:
    """hoptrace audit [--trace NAME] [--last N] [--json]: oldest first, the newest N."""
    entries = client_of(args).audit(args.last, args.trace or "")
    if args.json:
        print(json.dumps([audit_data(entry) for entry in entries], indent=2))
        return 0
    if not entries:
        print("no entries" + (f" of trace {args.trace}" if args.trace else ""))
        return 0
    print(table(audit_rows(entries)))
    return 0


def add_parser(subparsers: Any, client: argparse.ArgumentParser) -> None:
    """Register ``audit`` on a subparsers object (cli/main.py)."""
    audit = subparsers.add_parser(
        "audit",
        parents=[client],
        help="who applied, deleted and ran what",
        description="The dispatcher's audit trail, oldest first: each apply, delete, preset and discovery "
        "with the caller's token, role and certificate, the trace and generation, and how it ended.",
    )
    audit.add_argument("--trace", metavar="NAME", help="only the entries of this trace")
    audit.add_argument("--last", type=int, default=50, metavar="N", help="the newest N entries (0: all; 50)")
    audit.add_argument("--json", action="store_true", help="print a JSON list")
    audit.set_defaults(func=run_audit)
