"""An image a request names by URL, fetched within bounds, from an allowed host only.

``api.image_url_hosts`` lists the hosts whose images may be fetched; empty (the default):
every URL is refused (``image_url_refused``). The rule is the webhooks' one
(``common.pipeline.notify``): the host is looked up at the fetch, and it is its checked
address that is connected to, so a name cannot be re-pointed between the check and the
connection. The fetch is HTTP/1.0 (no chunks to decode), follows no redirect, reads at
most ``api.max_upload_bytes`` and ends within ``api.image_url_timeout_s`` however slowly
the server sends. The bytes are then checked as an upload's are.
"""

from __future__ import annotations

from api.errors import ApiError
from common.config import Settings
from common.errors import InvalidInput
from common.pipeline.notify import Target, check_url, connected, deadline_of, host_of, resolved

MAX_HEAD = 65536


def check_allowed(url: str, settings: Settings) -> None:
    """Refuse (400 ``image_url_refused``) a URL whose host the operator has not allowed."""
    allowed = settings.api.image_url_hosts
    try:
        check_url(url, allowed)
        host = host_of(url)
    except InvalidInput:
        host = ""
    if not host or host not in set(allowed):
        raise ApiError(
            400,
            "image_url_refused",
            "image_url: this server fetches images only from the hosts its operator allows "
            "(api.image_url_hosts); send the image inline as data:image/...;base64,...",
        )


def image_bytes(url: str, settings: Settings) -> bytes:
    """The bytes at ``url``, or an ``ApiError`` that says why not."""
    check_allowed(url, settings)
    try:
        target = resolved(url, settings.api.image_url_hosts)
        return _get(target, settings.api.max_upload_bytes, settings.api.image_url_timeout_s)
    except (OSError, ValueError) as exc:  # (TimeoutError and ConnectionError are OSErrors)
        raise ApiError(400, "image_url_unreadable", f"image_url: {exc}"[:300]) from None


def _get(target: Target, limit: int, timeout_s: float) -> bytes:
    left = deadline_of(timeout_s, "image")
    with connected(target, left) as connection:
        request = f"GET {target.path} HTTP/1.0\r\nHost: {target.netloc}\r\nAccept: image/*\r\n\r\n"
        connection.settimeout(left())
        connection.sendall(request.encode("latin-1"))
        received = b""
        while True:
            connection.settimeout(left())
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
            head_end = received.find(b"\r\n\r\n")
            if head_end < 0 and len(received) > MAX_HEAD:
                raise ConnectionError("the answer's head is over 64 KiB")
            if head_end >= 0 and len(received) - head_end - 4 > limit:
                raise ConnectionError(f"the image is over {limit} bytes (api.max_upload_bytes)")
    head, separator, body = received.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split(b" ")
    if not separator or len(status) < 2 or not status[0].startswith(b"HTTP/"):
        raise ConnectionError("not an HTTP answer")
    if status[1] != b"200":
        raise ConnectionError(f"the server answered {status[1].decode('latin-1')[:3]}, not 200")
    return body
