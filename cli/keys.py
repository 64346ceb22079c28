"""``speceyes keys``: API keys (the secret is printed once; the store keeps a hash)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from cli.options import add_store_flags, settings_from_args
from common.contracts import Priority
from common.errors import InvalidInput
from common.store.db import open_store
from common.store.keys import create_key, list_keys, revoke_key
from common.store.tables import as_utc


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create",
        help="create a key and print it (only this once)",
        description="Create an API key. A key submits and reads the jobs and batches of its "
        "tenant only (another tenant's ids answer 404); an --admin key reads every tenant's, "
        "and what the command line made.",
    )
    create.add_argument("name", help="who or what the key is for")
    create.add_argument(
        "--tenant",
        help="whose jobs the key submits and reads (default: the key's NAME); "
        "keys of one tenant share its jobs and idempotency keys",
    )
    create.add_argument("--admin", action="store_true", help="may read every tenant's jobs")
    create.add_argument(
        "--max-priority",
        choices=[priority.value for priority in Priority],
        default=Priority.HIGH.value,
        help="the most urgent priority the key's jobs may ask for (default high); a key "
        "limited to normal sends its single jobs at normal, and is refused (403) high",
    )
    create.add_argument(
        "--jobs-per-day",
        type=int,
        metavar="N",
        help="its tenant's quota of jobs a day, UTC (default: accounting_max_jobs_per_day); "
        "past it a submission is refused whole (429)",
    )
    create.add_argument(
        "--compute-s-per-day",
        type=float,
        metavar="S",
        help="its tenant's quota of model seconds a day, UTC (default: "
        "accounting_max_compute_s_per_day); once used, submissions are refused (429)",
    )
    create.add_argument(
        "--replace",
        action="store_true",
        help="revoke the active keys of this NAME first (in the same transaction): a key "
        "made again each time, as `make browse` does, leaves only the last one working",
    )
    create.set_defaults(run=run_create)
    listing = actions.add_parser("list", help="names, ids and states of the keys")
    listing.set_defaults(run=run_list)
    revoke = actions.add_parser("revoke", help="revoke a key by name or id")
    revoke.add_argument("key", metavar="NAME_OR_ID")
    revoke.set_defaults(run=run_revoke)
    for sub in (create, listing, revoke):
        add_store_flags(sub)


def _sessions(args: argparse.Namespace, *, create: bool = False) -> Any:
    return open_store(settings_from_args(args).database_url, create=create)


def run_create(args: argparse.Namespace) -> int:
    if not args.name.strip():
        raise InvalidInput("a key needs a name: who or what it is for")
    for flag, quota in (
        ("--jobs-per-day", args.jobs_per_day),
        ("--compute-s-per-day", args.compute_s_per_day),
    ):
        if quota is not None and not 0 <= quota < math.inf:
            raise InvalidInput(f"{flag} is a quota: 0 or more, not {quota}")
    # committed before the secret is printed: a reader that takes the first line and
    # leaves (`keys create NAME | head -1`) must not leave us holding an unsaved key
    with _sessions(args, create=True).begin() as session:
        replaced = revoke_key(session, args.name) if args.replace else 0
        namesakes = [row for row in list_keys(session) if row.name == args.name]
        row, secret = create_key(
            session,
            args.name,
            tenant=args.tenant,
            admin=args.admin,
            max_priority=Priority(args.max_priority),
            jobs_per_day=args.jobs_per_day,
            compute_s_per_day=args.compute_s_per_day,
        )
        role = "admin, reads every tenant" if row.admin else f"tenant {row.tenant!r}"
        described = f"key {row.id} for {row.name!r} ({role}): shown once, keep it safe"
    print(secret, flush=True)  # alone on stdout: KEY=$(speceyes keys create NAME)
    print(described, file=sys.stderr)
    if replaced:
        print(f"revoked {replaced} earlier key(s) named {args.name!r}", file=sys.stderr)
    live = [namesake.id for namesake in namesakes if namesake.revoked_at is None]
    if live:
        print(
            f"note: {len(live)} other active key(s) named {args.name!r} ({', '.join(live)}): "
            f"`keys revoke {args.name}` revokes them all, `keys revoke ID` one",
            file=sys.stderr,
        )
    return 0


def run_list(args: argparse.Namespace) -> int:
    with _sessions(args)() as session:
        for row in list_keys(session):
            state = f"revoked {row.revoked_at:%Y-%m-%d}" if row.revoked_at else "active"
            role = "admin" if row.admin else f"tenant {row.tenant}"
            made = as_utc(row.created_at)
            quotas = [
                f"{figure:g} {unit} a day"
                for figure, unit in ((row.jobs_per_day, "jobs"), (row.compute_s_per_day, "s"))
                if figure is not None
            ]
            limits = f"  quota {', '.join(quotas)}" if quotas else ""
            print(f"{row.id}  {row.name:<30} {made:%Y-%m-%d %H:%M} UTC  {state}  {role}{limits}")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    with _sessions(args).begin() as session:
        count = revoke_key(session, args.key)
    if not count:
        raise InvalidInput(f"no active key named or with id {args.key!r}")
    print(f"revoked {count} key(s)")
    return 0
