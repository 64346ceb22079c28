"""``speceyes webhooks``: a tenant's endpoints, its callback secret, and the deliveries
with each try (what ``/v1/webhooks`` does, on the store directly; the senders run in
``speceyes serve`` and in every worker)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.options import add_store_flags, settings_from_args
from common.errors import InvalidInput, NotFound
from common.pipeline.notify import check_url
from common.store import deliveries, webhooks
from common.store.db import open_store
from common.store.tables import iso_utc


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Where events go: job.finished (a job sent alone ended), batch.finished, "
        "batch.cancelled, audit.alarm. Each delivery is a POST signed as the Standard "
        "Webhooks spec says, tried again with backoff for webhook_retry_for_s (24 h), at "
        "least once: receivers deduplicate by its webhook-id. Without --tenant: the "
        "command line's own work."
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser(
        "add",
        help="register an endpoint and print its signing secret",
        description="Register URL for the tenant's events. Loopback, private and "
        "link-local addresses are refused unless allowed (SPECEYES_WEBHOOK_ALLOW_HOSTS).",
    )
    add.add_argument("url")
    add.add_argument(
        "--events",
        nargs="+",
        choices=webhooks.EVENT_TYPES,
        default=list(webhooks.EVENT_TYPES),
        help="which events it takes (default: all)",
    )
    add.set_defaults(run=run_add)
    listing = actions.add_parser("list", help="the endpoints: id, URL, events")
    listing.set_defaults(run=run_list)
    remove = actions.add_parser("remove", help="stop sending to an endpoint")
    remove.add_argument("id")
    remove.set_defaults(run=run_remove)
    secret = actions.add_parser("secret", help="the secret callback URLs are signed with")
    secret.set_defaults(run=run_secret)
    deliveries = actions.add_parser(
        "deliveries", help="the deliveries, newest first, a JSON line each with its tries"
    )
    deliveries.add_argument(
        "--state", choices=(webhooks.PENDING, webhooks.DELIVERED, webhooks.FAILED)
    )
    deliveries.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    deliveries.set_defaults(run=run_deliveries)
    for sub in (add, listing, remove, secret, deliveries):
        sub.add_argument("--tenant", help="whose (an API key's tenant); default: the CLI's")
        add_store_flags(sub)


def _sessions(args: argparse.Namespace) -> Any:
    return open_store(settings_from_args(args).database_url, create=False)


def run_add(args: argparse.Namespace) -> int:
    settings = settings_from_args(args).webhooks
    url = check_url(args.url, settings.allow_hosts)
    with _sessions(args).begin() as session:
        endpoint = webhooks.add_endpoint(
            session, args.tenant, url, args.events, settings.max_endpoints
        )
        print(f"endpoint {endpoint.id} for {', '.join(endpoint.events)}")
        print(f"secret {endpoint.secret}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    with _sessions(args)() as session:
        found = webhooks.endpoints(session, args.tenant)
        for endpoint in found:
            print(f"{endpoint.id}  {endpoint.url}  {' '.join(endpoint.events)}")
    if not found:
        whose = f"tenant {args.tenant!r}" if args.tenant else "the command line"
        print(f"no endpoints of {whose} (speceyes webhooks add URL)", file=sys.stderr)
    return 0


def run_remove(args: argparse.Namespace) -> int:
    with _sessions(args).begin() as session:
        if not webhooks.remove_endpoint(session, args.tenant, args.id):
            raise NotFound(f"no endpoint {args.id} in use", code="endpoint_not_found")
    print(f"removed {args.id}")
    return 0


def run_secret(args: argparse.Namespace) -> int:
    with _sessions(args).begin() as session:
        print(webhooks.callback_secret(session, args.tenant))
    return 0


def run_deliveries(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 500:
        raise InvalidInput(f"--limit is 1 to 500; got {args.limit}")
    with _sessions(args)() as session:
        rows, _ = deliveries.deliveries_page(
            session, args.tenant, state=args.state, limit=args.limit
        )
        for delivery, event, attempts in rows:
            line = {
                "id": delivery.id,
                "event_id": event.id,
                "type": event.type,
                "subject": event.subject,
                "url": delivery.url,
                "state": delivery.state,
                "attempts": [
                    {"at": iso_utc(a.at), "status_code": a.status_code, "error": a.error}
                    for a in attempts
                ],
            }
            print(json.dumps(line))
    return 0
