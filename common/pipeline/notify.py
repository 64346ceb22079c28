"""Sending webhooks: the outbox's deliveries (``common.store.webhooks``) go out, signed.

Every process that serves the API or works a queue runs one ``Notifier`` thread. Each
``poll_s`` it announces the batches that ended, then takes the deliveries that are due
(``claim_due``: held past one try's time limit, so two senders never send one at once
and a sender that dies leaves its deliveries to be tried again) and sends them, up to
``concurrency`` at once. A delivery whose time has run out is failed, not sent.

A delivery is a POST of the event's JSON, signed as the Standard Webhooks spec says
(``webhook-id``: the event's id, the same on every try, for receivers to deduplicate;
``webhook-timestamp``; ``webhook-signature``). An answer in 2xx delivers it. Anything
else (an error status, a redirect, which is never followed, no whole answer head within
``timeout_s``: a hard limit on the whole try, however slowly the receiver trickles) is
kept as an attempt and tried again after a capped, jittered backoff
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

import contextlib
import ipaddress
import logging
import math
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks import Webhook

from common.backends.inference_client import Backoff, seconds_of_retry_after
from common.config import WebhookSettings
from common.errors import InvalidInput
from common.store import deliveries, webhooks
from common.store.tables import utcnow

log = logging.getLogger(__name__)

MAX_URL_CHARS = 2000
KEPT_ANSWER_CHARS = 300  # of a receiver's answer, in the attempt's record
MAX_ANSWER_HEAD = 65536  # the status line and headers a receiver may send


class UnsafeUrl(InvalidInput):
    """A URL deliveries may not go to."""


def check_url(url: str, allow_hosts: Iterable[str] = ()) -> str:
    """``url`` as a delivery may take it: well formed, and not a name or address of this
    side of the network (which a receiver's lookup is checked for again at each try).
    ``InvalidInput`` (``invalid_callback_url``) or ``UnsafeUrl`` (``callback_url_refused``)."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS or not _utf8(url):
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
    if parts.port == 0:
        raise InvalidInput("a callback URL's port is 1 to 65535", code="invalid_callback_url")
    host = host_of(url)
    if host in set(allow_hosts):
        return url
    if host == "localhost" or host.endswith((".localhost", ".internal", ".local")):
        raise UnsafeUrl(f"{host} is this side of the network", code="callback_url_refused")
    literal = _numeric(host)
    if literal is None:
        return url  # a name: its addresses are checked at each try
    _check_address(literal, host)
    return url


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # (a lone surrogate)
        return False
    return True


def host_of(url: str) -> str:
    """The URL's host as the resolver will look it up: IDNA, lower case, no final dot
    (``ｌｏｃａｌｈｏｓｔ.`` is ``localhost``). ``InvalidInput`` for one no resolver takes."""
    host = urlsplit(url).hostname or ""
    if ":" in host:  # an IPv6 address
        return host
    try:
        return host.rstrip(".").encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise InvalidInput(
            f"{host[:80]!r} is no host name (an empty or too long label?)",
            code="invalid_callback_url",
        ) from None


def _numeric(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host written as one stands for, in any form the resolver takes
    (``2130706433``, ``0x7f.1``, ``127.1`` are 127.0.0.1), without a lookup; None: a name."""
    try:
        found = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        return None
    return ipaddress.ip_address(str(found[0][4][0]).split("%")[0])


# IPv6 ranges that carry an IPv4 address to a gateway (NAT64, 6to4, the deprecated
# IPv4-compatible and IPv4-translated forms): where one exists, they reach IPv4 inside
_CARRIERS = tuple(
    ipaddress.ip_network(net) for net in ("64:ff9b::/96", "2002::/16", "::/96", "::ffff:0:0:0/96")
)


def _check_address(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, host: str, *, shown: bool = True
) -> None:
    """Refuse an address that is not public. ``shown``: name it in the error (the caller
    wrote it); a looked-up address is not told back (it would map the inside)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    carried = isinstance(address, ipaddress.IPv6Address) and any(
        address in net for net in _CARRIERS
    )
    if carried or not address.is_global or address.is_multicast:
        what = f"is {address}, not" if shown else "resolves to an address that is not"
        raise UnsafeUrl(
            f"{host} {what} a public address (loopback, private, link-local or reserved); "
            "an operator may allow it (SPECEYES_WEBHOOK_ALLOW_HOSTS)",
            code="callback_url_refused",
        )


@dataclass(frozen=True)
class Target:
    """Where one try connects: an address that was checked, and what the request names."""

    address: str
    port: int
    tls: bool
    host: str  # for TLS and the Host header
    netloc: str  # the URL's host and port, as the Host header carries them
    path: str  # with its query


def resolved(url: str, allow_hosts: Iterable[str]) -> Target:
    """Where to connect for ``url``: its host looked up now, every address checked (the
    first one is used, so no second lookup can swap it). ``UnsafeUrl`` if any is not
    public; ``ConnectionError`` if it cannot be looked up."""
    check_url(url, allow_hosts)
    parts = urlsplit(url)
    host = host_of(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ConnectionError(f"cannot resolve {host}: {exc}") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]
    if host not in set(allow_hosts):
        for address in addresses:
            _check_address(address, host, shown=False)
    path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    return Target(str(addresses[0]), port, parts.scheme == "https", host, parts.netloc, path)


def deadline_of(timeout_s: float, what: str) -> Callable[[], float]:
    """The seconds left of ``timeout_s`` from now, each time it is called; a
    ``TimeoutError`` ("no whole WHAT within ...") once none are."""
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no whole {what} within {timeout_s:g} s")
        return remaining

    return left


@contextlib.contextmanager
def connected(target: Target, left: Callable[[], float]) -> Iterator[socket.socket]:
    """A connection to the checked address of ``target`` (TLS where it says, verified for
    its host name), within the time ``left``; closed afterwards."""
    raw = socket.create_connection((target.address, target.port), timeout=left())
    with contextlib.closing(raw):
        if not target.tls:
            yield raw
            return
        context = ssl.create_default_context()
        with context.wrap_socket(raw, server_hostname=target.host) as wrapped:
            yield wrapped


def post(
    target: Target, body: bytes, headers: dict[str, str], timeout_s: float
) -> tuple[int, str, float | None]:
    """POST ``body``; the status, the start of the answer and its ``Retry-After`` in
    seconds (if a finite number of them). The whole try, connecting
    to the last byte read, ends within ``timeout_s`` (``TimeoutError``), however slowly
    the receiver answers; an answer head over 64 KiB is refused."""
    left = deadline_of(timeout_s, "answer")
    with connected(target, left) as connection:
        lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.netloc}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        connection.settimeout(left())
        connection.sendall("\r\n".join(lines).encode("latin-1") + body)
        received = b""
        while b"\r\n\r\n" not in received:
            if len(received) > MAX_ANSWER_HEAD:
                raise ConnectionError("the answer's head is over 64 KiB")
            connection.settimeout(left())
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    fields = status_line.split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
        raise ConnectionError(f"not an HTTP answer: {status_line[:80]!r}")
    answer = rest[:KEPT_ANSWER_CHARS].decode("utf-8", errors="replace").strip()
    return int(fields[1]), answer, _retry_after(head)


def _retry_after(head: bytes) -> float | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"retry-after":
            seconds = seconds_of_retry_after(value.strip().decode("latin-1"))
            return seconds if seconds is not None and math.isfinite(seconds) else None
    return None


class Notifier:
    """The sending thread of one process (see the module's text)."""

    def __init__(self, sessions: sessionmaker[Session], settings: WebhookSettings) -> None:
        self.sessions = sessions
        self.settings = settings
        self.backoff = Backoff(first_s=settings.first_retry_s, max_s=settings.max_retry_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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
            due = deliveries.claim_due(
                session, self.settings.concurrency * 4, hold_s, self.settings.retry_for_s
            )
        if due:
            list(self._pool.map(self.deliver, due))
        return len(due)

    def deliver(self, due: deliveries.Due) -> str:
        """One try of one delivery, kept; the delivery's state after it."""
        at, started = utcnow(), time.monotonic()
        status, error, retry_after = self.send(due, at)
        seconds = time.monotonic() - started
        retry_in = None
        if error is not None:  # (never sooner than the first wait, whatever it asks)
            delay = self.backoff.delay_s(due.attempt, retry_after)
            retry_in = max(self.settings.first_retry_s, delay)
        with self.sessions.begin() as session:
            state = deliveries.record_attempt(
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

    def send(
        self, due: deliveries.Due, at: datetime
    ) -> tuple[int | None, str | None, float | None]:
        """POST the event: (status, why it failed or None, the receiver's Retry-After).
        Nothing a URL or a receiver does escapes as an exception: it is the try's error."""
        signature = Webhook(due.secret).sign(due.event_id, at, due.body)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "speceyes-webhooks/1",
            "webhook-id": due.event_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signature,
        }
        try:
            target = resolved(due.url, self.settings.allow_hosts)
            status, answer, retry_after = post(
                target, due.body.encode(), headers, self.settings.timeout_s
            )
        except TimeoutError:
            return None, f"no whole answer within {self.settings.timeout_s:g} s", None
        except (InvalidInput, ConnectionError) as exc:
            return None, str(exc)[:KEPT_ANSWER_CHARS], None
        except Exception as exc:  # (an address, a certificate, a socket: the try's error)
            return None, f"{type(exc).__name__}: {exc}"[:KEPT_ANSWER_CHARS], None
        if 200 <= status < 300:
            return status, None, None
        if 300 <= status < 400:
            return status, f"answered {status}: redirects are not followed", None
        why = f"answered {status}: {answer}".rstrip(": ")
        return status, why, retry_after
