"""``hoptrace certs`` (CA, certificates and tokens of a deployment), ``hoptrace revoke`` (a certificate onto
the CA's revocation list), ``hoptrace token create`` (a user API token), ``hoptrace plan sign`` (a plan file
an agent runs alone)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from hoptrace.cli.api import CliError
from hoptrace.common.grpcutil import ROLES, TOKEN_ENV, add_token
from hoptrace.v1 import agent_pb2


def run_certs(args: argparse.Namespace) -> int:
    """hoptrace certs --out DIR [--hosts H ...] [--agent NODE ...]: CA, certificates, tokens."""
    from hoptrace.common.certs import DEFAULT_CLIENTS, create_bundle

    try:
        clients = args.client or DEFAULT_CLIENTS
        bundle = create_bundle(args.out, hosts=args.hosts, agents=args.agent, clients=clients)
    except (OSError, ValueError) as error:
        raise CliError(f"certs: {error}") from None
    agents = ", ".join(f"agent-{node}" for node in bundle.agents) or "none (add --agent NODE)"
    clients = ", ".join(bundle.clients)
    print(f"certificates in {bundle.out}: ca, dispatcher, collector, {clients}; agents: {agents}")
    print(f"dispatcher tokens file: {bundle.tokens} (tokens in {bundle.out}/NAME.token)")
    print(f"revocation list for --crl: {bundle.crl} (`hoptrace revoke NAME --out {bundle.out}` adds to it)")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    """hoptrace revoke NAME... --out DIR: add the certificates to DIR/ca.crl, which every server and agent
    given --crl re-reads (docs/security.md, "Revocation")."""
    from hoptrace.common.certs import CRL_FILE, revoke

    try:
        revoked = revoke(args.out, args.name)
    except (OSError, ValueError) as error:
        raise CliError(f"revoke: {error}") from None
    for certificate in revoked:
        print(f"revoked {certificate.subject.rfc4514_string()} (serial {certificate.serial_number:x})")
    print(
        f"{Path(args.out) / CRL_FILE}: copy it where the servers' and agents' --crl points; they re-read it"
    )
    return 0


def run_token_create(args: argparse.Namespace) -> int:
    """hoptrace token create NAME --tokens FILE: append the token's hash, print the token once."""
    try:
        token = add_token(args.tokens, args.name, args.role)
    except (OSError, ValueError) as error:
        raise CliError(f"token: {error}") from None
    print(token)
    print(
        f"token {args.name} ({args.role}) added to {args.tokens}; keep it in a file for --token-file, "
        f"or in ${TOKEN_ENV}",
        file=sys.stderr,
    )
    return 0


def run_plan_sign(args: argparse.Namespace) -> int:
    """hoptrace plan sign PLAN --node N --signer-cert C --signer-key K --out FILE: a signed plan file for
    ``hoptrace-agent run --plan FILE --ca CA`` (docs/security.md, "Signed commands", Standalone)."""
    from hoptrace.dispatcher.signing import PLAN_TYPE, MessageSigner

    plan_path = Path(args.plan)
    try:
        plan = json_format.Parse(plan_path.read_text(), agent_pb2.TracePlan())
        if plan.object_path:
            # The signature must cover the object, not its name: embed the file (relative to the plan, as
            # the agent reads it).
            plan.object = (plan_path.parent / plan.object_path).read_bytes()
            plan.ClearField("object_path")
        if not plan.object:
            raise ValueError("the plan has no object (object or objectPath)")
        signer = MessageSigner.from_files(args.signer_cert, args.signer_key)
        signed = signer.sign(PLAN_TYPE, args.node, plan.SerializeToString())
        Path(args.out).write_text(json_format.MessageToJson(signed) + "\n")
    except (OSError, ValueError, json_format.ParseError) as error:
        raise CliError(f"plan sign {plan_path}: {error}") from None
    print(f"plan {plan.trace!r} for node {args.node} signed by {signer.subject}: {args.out}")
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``certs``, ``revoke``, ``token`` and ``plan`` on a subparsers object (cli/main.py)."""
    certs = subparsers.add_parser(
        "certs",
        help="create a CA, component certificates and tokens",
        description="Create (or extend: an existing CA in DIR is reused) the mTLS certificates and tokens.",
    )
    certs.add_argument("--out", required=True, metavar="DIR", help="where to write them")
    certs.add_argument(
        "--hosts", nargs="*", default=[], metavar="HOST", help="names/IPs of the dispatcher and collector"
    )
    certs.add_argument(
        "--agent", action="append", default=[], metavar="NODE", help="an agent certificate for NODE (repeat)"
    )
    certs.add_argument(
        "--client",
        action="append",
        default=None,
        metavar="NAME",
        help="a user API client certificate (repeat; default admin and web)",
    )
    certs.set_defaults(func=run_certs)

    revoke = subparsers.add_parser(
        "revoke",
        help="revoke certificates (the CA's CRL)",
        description="Add certificates to the CA's revocation list DIR/ca.crl (signed with DIR/ca.key). The "
        "dispatcher, the collector and the agents given --crl refuse them from their next call or "
        "handshake, without a restart.",
    )
    revoke.add_argument(
        "name", nargs="+", help="a certificate of DIR by name (agent-NODE, admin) or a .pem path"
    )
    revoke.add_argument("--out", required=True, metavar="DIR", help="the directory of `hoptrace certs`")
    revoke.set_defaults(func=run_revoke)

    token = subparsers.add_parser("token", help="manage user API tokens", description="User API tokens.")
    token_commands = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    create = token_commands.add_parser(
        "create", help="create a token", description="Create a token: its hash goes to FILE, it is printed."
    )
    create.add_argument("name", help="token name (who uses it)")
    create.add_argument("--tokens", required=True, metavar="FILE", help="the dispatcher's --tokens file")
    create.add_argument(
        "--role",
        choices=ROLES,
        default="viewer",
        help="viewer: read (agents, traces, reports); operator: also apply, delete, run presets; admin: all",
    )
    create.set_defaults(func=run_token_create)

    plan = subparsers.add_parser(
        "plan", help="standalone plan files", description="Plan files for hoptrace-agent run --plan."
    )
    plan_commands = plan.add_subparsers(dest="plan_command", metavar="ACTION", required=True)
    sign = plan_commands.add_parser(
        "sign",
        help="sign a plan file for one node",
        description="Sign a TracePlan (protojson) for NODE with a dispatcher certificate; its object file "
        "is embedded. The agent runs it with --ca instead of --allow-unsigned-plan.",
    )
    sign.add_argument("plan", help="the TracePlan file (protojson)")
    sign.add_argument("--node", required=True, help="the node whose agent runs it (its --node)")
    sign.add_argument("--signer-cert", required=True, metavar="PEM", help="a dispatcher certificate")
    sign.add_argument("--signer-key", required=True, metavar="PEM", help="its private key")
    sign.add_argument("--out", required=True, metavar="FILE", help="where to write the signed plan")
    sign.set_defaults(func=run_plan_sign)
