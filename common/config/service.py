"""Running as a service: the broker, recovery from faults, the HTTP API."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import SecretStr, field_validator

from common.config.base import Group, setting


class BrokerSettings(Group):
    """The distributed pipeline's broker (Redis) and queues; no URL: embedded mode."""

    url: str | None = setting(
        None,
        "Redis URL of the Celery broker; unset means embedded mode.",
        flag="--broker",
        metavar="URL",
    )
    key_prefix: str = setting(
        "", "Prefix of every Redis key the broker uses (isolates deployments)."
    )
    fast_queue: str = setting("speceyes.fast", "Queue of phases I-III (batched).", env="fast_queue")
    slow_queue: str = setting("speceyes.slow", "Queue of agent trajectories.", env="slow_queue")
    audit_queue: str = setting(
        "speceyes.audit", "Queue of audit runs (taken after deferred jobs).", env="audit_queue"
    )
    visibility_timeout_s: float = setting(
        3600.0,
        "A message taken by a worker that dies comes back after this many seconds. "
        "Must exceed the longest fast flush (up to fast_batch_size messages of "
        "fast_batch_size ids each, with its wait) and the longest slow message (up to "
        "16 trajectories one after another while the slow queue is busy), or a live job "
        "is handed out twice (harmless, but wasted work).",
        env="visibility_timeout_s",
        gt=0.0,
    )


class RecoverySettings(Group):
    """How the pipeline rides out faults: retries, heartbeats, the reconciler."""

    max_attempts: int = setting(
        3, "Tries per job and stage before it is failed with its reason.", ge=1
    )
    retry_delay_s: float = setting(
        2.0,
        "Wait before a job is tried again; doubles with each retry of an outage (up to "
        "retry_max_delay_s), with jitter.",
        ge=0.0,
    )
    retry_max_delay_s: float = setting(60.0, "The longest wait of a retry.", ge=0.0)
    heartbeat_s: float = setting(5.0, "A worker's heartbeat interval.", gt=0.0)
    worker_dead_after_s: float = setting(
        30.0,
        "A worker whose heartbeat is older than this is dead: the reconciler hands its "
        "running jobs to others (long before the visibility timeout).",
        gt=0.0,
    )
    reconcile_interval_s: float = setting(
        10.0, "How often the reconciler (one worker at a time) sweeps.", gt=0.0
    )
    reconcile_after_s: float = setting(
        30.0,
        "A waiting job whose message should have left the broker's queue this long ago "
        "(it went out before the queue's oldest message) and is not held by a worker is "
        "sent again (messages lost with a Redis restart, an enqueue that failed).",
        gt=0.0,
    )
    reconcile_slice: int = setting(
        10_000,
        "The most waiting jobs one sweep sends again per queue and priority, the longest "
        "gone first: the backlog a Redis restart loses goes out over several sweeps.",
        ge=1,
    )
    worker_stall_exit_s: float = setting(
        120.0,
        "A worker that has taken nothing for this long while its queue holds messages "
        "exits non-zero, for its supervisor to restart it.",
        gt=0.0,
    )
    consumer_resume_s: float = setting(
        10.0,
        "After the broker restarted, a worker whose consumer has not reconnected within "
        "this long (a Celery consumer can stay stuck) finishes what it runs and exits "
        "non-zero, for its supervisor to restart it.",
        gt=0.0,
    )


class ApiSettings(Group):
    """``speceyes serve``: where it listens, who may call it, how much each may send."""

    host: str = setting("127.0.0.1", "Address `speceyes serve` listens on.", flag="--host")
    port: int = setting(8000, "Port of `speceyes serve`.", flag="--port", ge=1, le=65535)
    log_format: Literal["text", "json"] = setting(
        "text",
        "How `speceyes serve` writes its line per request and per failed job on stderr: "
        "'text' or 'json' (one object a line, for log shippers).",
        flag="--log-format",
    )
    require_keys: bool = setting(True, "Every /v1 route needs a key (`speceyes keys create NAME`).")
    upload_dir: Path = setting(
        Path("~/.cache/speceyes/uploads"),
        "Where uploaded images are kept (by content hash); workers must read the same folder.",
        env="upload_dir",
    )
    image_roots: list[Path] = setting(
        description="Folders whose files jobs may name by server-side path (JSON list); "
        "empty: no server-side paths.",
        factory=list,
        env="image_roots",
    )
    max_upload_bytes: int = setting(
        20 * 1024 * 1024, "Largest image upload.", env="max_upload_bytes", ge=1
    )
    max_request_bytes: int = setting(
        256 * 1024 * 1024,
        "Largest request body (a batch with images).",
        env="max_request_bytes",
        ge=1,
    )
    max_batch_jobs: int = setting(
        10_000, "Most jobs in one batch request.", env="max_batch_jobs", ge=1
    )
    rate_per_s: float = setting(
        50.0, "Requests a second per API key (then 429 with Retry-After).", gt=0.0
    )
    rate_burst: int = setting(100, "Requests a key may make at once.", ge=1)
    max_jobs_in_flight: int = setting(
        100_000,
        "Unfinished jobs (queued, deferred, running) per tenant; a submission beyond "
        "it answers 429.",
        ge=1,
    )
    auth_failures_per_min: int = setting(
        30, "Failed authentications per client address a minute; more answer 429.", ge=1
    )
    decode_pixels: int = setting(
        100_000_000,
        "Pixels the API decodes at once to validate uploads (3-4 bytes each); "
        "more wait their turn. An image over it alone is decoded alone.",
        ge=1,
    )
    session_hours: float = setting(
        12.0, "How long a sign-in to the review pages (/ui) lasts.", gt=0.0
    )
    session_secret: SecretStr | None = setting(
        None,
        "Signs the review pages' session cookies (never printed). Unset: a new one at each "
        "start, which signs everyone out when the server restarts; set it where several "
        "server processes share the sign-ins.",
    )

    max_file_bytes: int = setting(
        100 * 1024 * 1024,
        "Largest file of requests (POST /openai/v1/files); its lines are at most max_batch_jobs.",
        ge=1,
    )
    image_url_hosts: list[str] = setting(
        description="Hosts whose images a request may name by URL (OpenAI's image_url; "
        "JSON list); empty: every image URL is refused. Fetched from the looked-up address, "
        "at most max_upload_bytes, no redirects.",
        factory=list,
    )
    image_url_timeout_s: float = setting(
        10.0, "The whole fetch of an image URL, connecting to the last byte.", gt=0.0
    )
    chat_wait_s: float = setting(
        120.0,
        "How long POST /openai/v1/chat/completions waits for its job's answer; past it "
        "the answer is a 504 naming the job, which goes on (read it at /v1/jobs/{id}).",
        gt=0.0,
    )

    @field_validator("upload_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()


class WebhookSettings(Group):
    """Events sent to the URLs callers name (``/v1/webhooks``, a ``callback_url``)."""

    retry_for_s: float = setting(
        86_400.0,
        "How long a delivery is tried again (capped, jittered backoff) before it is given "
        "up as failed.",
        gt=0.0,
    )
    first_retry_s: float = setting(5.0, "The wait before a delivery's second try.", gt=0.0)
    max_retry_s: float = setting(
        3600.0, "The longest wait between two tries of a delivery.", gt=0.0
    )
    timeout_s: float = setting(
        10.0, "How long one try waits for the receiver's answer (connect and read).", gt=0.0
    )
    allow_hosts: list[str] = setting(
        description="Hosts (names or addresses, JSON list) deliveries may go to although "
        "they are loopback, private, link-local or a cloud's metadata address; every "
        "other such address is refused.",
        factory=list,
    )
    poll_s: float = setting(
        1.0,
        "How often a sender looks for deliveries that are due and batches that ended.",
        gt=0.0,
    )
    concurrency: int = setting(4, "Deliveries one process sends at once.", ge=1)
    max_endpoints: int = setting(
        20,
        "Endpoints a tenant may register (each event is written once per endpoint, in the "
        "transaction of the change it tells of).",
        ge=1,
    )
