"""Sending webhooks: the outbox's deliveries (``common.store.webhooks``) go out, signed.

Every process that serves the API or works a queue runs one ``Notifier`` thread. Each
``poll_s`` it announces the batches that ended, then takes the deliveries that are due
(``claim_due``: held past one try's time limit, so two senders never send one at once
and a sender that dies leaves its deliveries to be tried again) and sends them, up to
``concurrency`` at once.

A delivery is a POST of the event's JSON, signed as the Standard Webhooks spec says
(``webhook-id``: the event's id, the same on every try, for receivers to deduplicate;
``webhook-timestamp``; ``webhook-signature``). An answer in 2xx delivers it. Anything
else (an error status, a redirect, which is never followed, no answer within
``timeout_s``) is kept as an attempt and tried again after a capped, jittered backoff
(``first_retry_s`` doubling up to ``max_retry_s``), until ``retry_for_s`` after the
event: then it is failed. At least once, never lost; receivers deduplicate by id.

A URL is hostile until checked (``check_url``): http or https, a host, no user or
password. Its host's addresses are resolved before each try and must all be public:
loopback, private, link-local (a cloud's metadata address among them), multicast and
reserved ones are refused, unless the operator allows that host (``allow_hosts``). The
connection goes to the address that was checked, never to a second lookup's (DNS
rebinding), with the name kept for the ``Host`` header and TLS.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from urllib.parse import urlsplit, urlunsplit

import httpx
from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks import Webhook

from common.backends.inference_client import Backoff, retry_after_s
from common.config import WebhookSettings
from common.errors import InvalidInput
from common.store import webhooks
from common.store.tables import utcnow

log = logging.getLogger(__name__)

MAX_URL_CHARS = 2000
KEPT_ANSWER_CHARS = 300  # of a receiver's answer, in the attempt's record


class UnsafeUrl(InvalidInput):
    """A URL deliveries may not go to."""


def check_url(url: str, allow_hosts: Iterable[str] = ()) -> str:
    """``url`` as a delivery may take it: well formed, and not a name or address of this
    side of the network (which a receiver's lookup is checked for again at each try).
    ``InvalidInput`` (``invalid_callback_url``) or ``UnsafeUrl`` (``callback_url_refused``)."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise InvalidInput(
            f"a callback URL is an http(s) URL of at most {MAX_URL_CHARS} characters",
            code="invalid_callback_url",
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- (read: a port that is no number is refused here)
    except ValueError as exc:
        raise InvalidInput(f"not a URL: {exc}", code="invalid_callback_url") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(
            "a callback URL starts with http:// or https:// and names a host",
            code="invalid_callback_url",
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidInput(
            "a callback URL may not carry a user or password (deliveries are signed)",
            code="invalid_callback_url",
        )
    if any(ord(char) < 33 for char in url):
        raise InvalidInput(
            "a callback URL has no spaces or control characters", code="invalid_callback_url"
        )
    host = parts.hostname
    if host in set(allow_hosts):
        return url
    if host == "localhost" or host.endswith((".localhost", ".internal", ".local")):
        raise UnsafeUrl(f"{host} is this side of the network", code="callback_url_refused")
    literal = _numeric(host)
    if literal is None:
        return url  # a name: its addresses are checked at each try
    _check_address(literal, host)
    return url


def _numeric(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host written as one stands for, in any form the resolver takes
    (``2130706433``, ``0x7f.1``, ``127.1`` are 127.0.0.1), without a lookup; None: a name."""
    try:
        found = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        return None
    return ipaddress.ip_address(str(found[0][4][0]).split("%")[0])


def _check_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address, host: str) -> None:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if not address.is_global or address.is_multicast:
        raise UnsafeUrl(
            f"{host} is {address}, not a public address (loopback, private, link-local or "
            "reserved); an operator may allow it (SPECEYES_WEBHOOK_ALLOW_HOSTS)",
            code="callback_url_refused",
        )


def resolved(url: str, allow_hosts: Iterable[str]) -> tuple[str, str]:
    """The URL to connect to (its host replaced by an address that was checked) and the
    host name it stood for. ``UnsafeUrl`` if any address of the host is not public."""
    check_url(url, allow_hosts)
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConnectionError(f"cannot resolve {host}: {exc}") from None
    addresses = [ipaddress.ip_address(info[4][0]) for info in found]
    if host not in set(allow_hosts):
        for address in addresses:
            _check_address(address, host)
    address = addresses[0]
    shown = f"[{address}]" if address.version == 6 else str(address)
    netloc = shown if parts.port is None else f"{shown}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc)), parts.netloc


class Notifier:
    """The sending thread of one process (see the module's text)."""

    def __init__(self, sessions: sessionmaker[Session], settings: WebhookSettings) -> None:
        self.sessions = sessions
        self.settings = settings
        self.backoff = Backoff(first_s=settings.first_retry_s, max_s=settings.max_retry_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = httpx.Client(
            timeout=settings.timeout_s, follow_redirects=False, trust_env=False
        )
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="speceyes-webhook")
        self._failing = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="speceyes-notifier", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop taking deliveries; those in flight end within one try's time limit."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.timeout_s + 5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                sent = self.tick()
            except Exception:  # an outage of the store: the next tick tries again
                if not self._failing:
                    log.exception("webhooks: cannot reach the store; trying again")
                self._failing, sent = True, 0
            else:
                self._failing = False
            if not sent:
                self._stop.wait(self.settings.poll_s)

    def tick(self) -> int:
        """Announce the batches that ended; send what is due. How many were sent."""
        with self.sessions.begin() as session:
            webhooks.batches_ended(session)
        hold_s = self.settings.timeout_s * 2 + 5  # (one try, its record, and a margin)
        with self.sessions.begin() as session:
            due = webhooks.claim_due(
                session, self.settings.concurrency * 4, hold_s, self.settings.retry_for_s
            )
        if due:
            list(self._pool.map(self.deliver, due))
        return len(due)

    def deliver(self, due: webhooks.Due) -> str:
        """One try of one delivery, kept; the delivery's state after it."""
        at, started = utcnow(), time.monotonic()
        status, error, retry_after = self.send(due, at)
        seconds = time.monotonic() - started
        retry_in = None if error is None else self.backoff.delay_s(due.attempt, retry_after)
        with self.sessions.begin() as session:
            state = webhooks.record_attempt(
                session,
                due,
                at=at,
                seconds=seconds,
                status_code=status,
                error=error,
                retry_in_s=retry_in,
            )
        if state == webhooks.FAILED:
            log.warning("webhook %s to %s given up: %s", due.event_id, due.url, error)
        return state

    def send(self, due: webhooks.Due, at: datetime) -> tuple[int | None, str | None, float | None]:
        """POST the event: (status, why it failed or None, the receiver's Retry-After)."""
        try:
            target, host = resolved(due.url, self.settings.allow_hosts)
        except (UnsafeUrl, ConnectionError) as exc:
            return None, str(exc), None
        signature = Webhook(due.secret).sign(due.event_id, at, due.body)
        headers = {
            "host": host,
            "content-type": "application/json",
            "user-agent": "speceyes-webhooks/1",
            "webhook-id": due.event_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signature,
        }
        extensions = {"sni_hostname": urlsplit(due.url).hostname or ""}
        try:
            with self._client.stream(
                "POST", target, content=due.body.encode(), headers=headers, extensions=extensions
            ) as response:
                answer = _first_bytes(response)
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"[:KEPT_ANSWER_CHARS] or "no answer", None
        if 200 <= response.status_code < 300:
            return response.status_code, None, None
        if 300 <= response.status_code < 400:
            why = f"answered {response.status_code}: redirects are not followed"
        else:
            why = f"answered {response.status_code}: {answer}".rstrip(": ")
        return response.status_code, why, retry_after_s(response)


def _first_bytes(response: httpx.Response) -> str:
    """The start of a receiver's answer, read no further (it may be endless)."""
    kept = b""
    for chunk in response.iter_bytes():
        kept += chunk
        if len(kept) >= KEPT_ANSWER_CHARS:
            break
    return kept[:KEPT_ANSWER_CHARS].decode("utf-8", errors="replace").strip()
