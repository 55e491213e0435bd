"""`provisiond token create|list|revoke`: bearer tokens for the HTTP API."""

from __future__ import annotations

import sys
import time

from provisiond.audit import cli_actor
from provisiond.auth import Role
from provisiond.service import tokens


def register(subparsers) -> None:
    parser = subparsers.add_parser("token", help="API tokens (reader, operator, admin)")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    create = verbs.add_parser(
        "create", help="make a token and print it once (stored only as a hash)",
        description="Roles: reader reads everything; operator also powers, builds and "
        "reprovisions; admin also changes the inventory, secrets and tokens.")
    create.add_argument("--name", required=True, help="a unique name (a DNS label), shown "
                        "in the audit log as token:NAME")
    create.add_argument("--role", required=True, choices=[r.label for r in Role])
    create.add_argument("--expires-in", type=float, metavar="SECONDS",
                        help="expire after this many seconds (default: never)")
    create.set_defaults(func=cmd_create)
    listing = verbs.add_parser("list", help="tokens: name, role, created, expires")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
    revoke = verbs.add_parser("revoke", help="revoke a token: refused from then on")
    revoke.add_argument("name")
    revoke.set_defaults(func=cmd_revoke)


def cmd_create(args, ctx) -> None:
    token, record = tokens.create_token(ctx.config, cli_actor(), args.name,
                                        Role.parse(args.role), args.expires_in)
    print(token)
    print(f"token {record['name']} ({record['role']}) made: it is shown this once; send it "
          "as 'Authorization: Bearer TOKEN'", file=sys.stderr)


def cmd_list(args, ctx) -> None:
    found = tokens.list_tokens(ctx.config)
    if args.json:
        return ctx.print_json(found)
    ctx.print_table(["NAME", "ROLE", "CREATED", "EXPIRES"],
                    [[t["name"], t["role"], _when(t["created"]),
                      _when(t["expires"]) if t["expires"] else "never"] for t in found])
    return None


def cmd_revoke(args, ctx) -> None:
    tokens.revoke_token(ctx.config, cli_actor(), args.name)
    print(f"revoked token {args.name}")


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
