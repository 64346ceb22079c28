"""A Python client of the SpecEyes HTTP API (httpx only: the speceyes-client distribution,
``pip install ./client``, needs neither torch nor celery; ``api.client`` re-exports it).

    client = SpecEyesClient("http://127.0.0.1:8000", api_key="sk-speceyes-...")
    job = client.submit("photo.jpg", "What is the color of the car?", options=["red", "blue"])
    done = client.wait(job.id, timeout=60)
    print(done["answer"], done["answered_by"])

Errors come back as exceptions carrying the server's ``error`` code and ``detail``:
``Unauthorized`` (401), ``NotFound`` (404), ``Conflict`` (409), ``LimitExceeded`` (413),
``RateLimited`` (429, with ``retry_after_s``), ``InvalidRequest`` (other 4xx),
``ServerError`` (5xx), ``Timeout`` (``wait`` ran out).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

FINISHED = ("done", "failed", "cancelled")


class ApiClientError(Exception):
    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail


class Unauthorized(ApiClientError): ...


class NotFound(ApiClientError): ...


class Conflict(ApiClientError): ...


class LimitExceeded(ApiClientError): ...


class InvalidRequest(ApiClientError): ...


class RateLimited(ApiClientError):
    """429: over a rate or quota; ``retry_after_s`` says when to come back."""

    retry_after_s: float = 1.0


class ServerError(ApiClientError): ...


class Timeout(Exception):
    """``wait`` passed its deadline; the job goes on."""


_BY_STATUS: dict[int, type[ApiClientError]] = {
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: LimitExceeded,
    429: RateLimited,
}


@dataclass(frozen=True)
class Submitted:
    id: str
    status: str
    created: bool


class SpecEyesClient:
    """``base_url`` and ``api_key``; or ``http``: a ready httpx.Client (tests, proxies)."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        http: httpx.Client | None = None,
        timeout: float = 30.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self.http.headers.update(headers)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> SpecEyesClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- submitting ---------------------------------------------------------------------
    def submit(
        self,
        image: str | Path | bytes,
        question: str,
        *,
        options: list[str] | None = None,
        idempotency_key: str | None = None,
        batch_id: str | None = None,
        priority: str | None = None,
        callback_url: str | None = None,
    ) -> Submitted:
        """One job from a local file (uploaded) or bytes. Returns at once (202). A single
        job is high priority unless ``priority`` ("normal", "low") or the key says less.
        ``callback_url``: where its end is posted (job.finished, signed with
        ``webhook_secret()``)."""
        data = image if isinstance(image, bytes) else Path(image).read_bytes()
        name = "image" if isinstance(image, bytes) else Path(image).name
        form: dict[str, str] = {"question": question}
        if options is not None:
            form["options"] = json.dumps(options)
        if idempotency_key is not None:
            form["idempotency_key"] = idempotency_key
        if batch_id is not None:
            form["batch_id"] = batch_id
        if priority is not None:
            form["priority"] = priority
        if callback_url is not None:
            form["callback_url"] = callback_url
        body = self._json(self.http.post("/v1/jobs", data=form, files={"image": (name, data)}))
        return Submitted(body["id"], body["status"], body["created"])

    def submit_many(
        self,
        jobs: Iterable[dict[str, Any]],
        *,
        name: str | None = None,
        idempotency_key: str | None = None,
        priority: str | None = None,
        callback_url: str | None = None,
    ) -> dict[str, Any]:
        """A batch. Each job: {"image": path or bytes} or {"image_path": server path},
        plus "question" and optionally "options", "id", "answer". Returns
        {"id": batch id, "job_ids": [...], "created": bool, "refused": [...]}: a job
        that is wrong (a broken image, a question over the limit) does not refuse the
        batch; it is a failed job, listed in "refused" with its index, id, job_id, error
        code and detail. ``priority``: "high", "normal" (the default) or "low".
        ``callback_url``: where the batch's events are posted (batch.finished, ...)."""
        specs = [self._spec(job) for job in jobs]
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body: dict[str, Any] = {"name": name, "jobs": specs}
        if priority is not None:
            body["priority"] = priority
        if callback_url is not None:
            body["callback_url"] = callback_url
        return self._json(self.http.post("/v1/batches", json=body, headers=headers))

    # -- reading ------------------------------------------------------------------------
    def get(self, job_id: str) -> dict[str, Any]:
        return self._json(self.http.get(f"/v1/jobs/{job_id}"))

    def trace(self, job_id: str) -> dict[str, Any]:
        return self._json(self.http.get(f"/v1/jobs/{job_id}/trace"))

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self._json(self.http.get(f"/v1/batches/{batch_id}"))

    def wait(self, job_id: str, *, timeout: float = 300.0, every: float = 0.5) -> dict[str, Any]:
        """Poll the job until it is done or failed; ``Timeout`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job["status"] in FINISHED:
                return job
            if time.monotonic() > deadline:
                raise Timeout(f"job {job_id} is still {job['status']} after {timeout} s")
            time.sleep(every)  # polling the server: the job's state is the answer

    def wait_batch(
        self, batch_id: str, *, timeout: float = 3600.0, every: float = 1.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            batch = self.batch(batch_id)
            if batch["finished"] >= batch["jobs"]:
                return batch
            if time.monotonic() > deadline:
                raise Timeout(f"batch {batch_id}: {batch['finished']}/{batch['jobs']} finished")
            time.sleep(every)  # polling the server: the batch's counts are the answer

    def results(self, batch_id: str) -> Iterator[dict[str, Any]]:
        """The batch's rows in order, streamed (JSONL)."""
        with self.http.stream("GET", f"/v1/batches/{batch_id}/results") as response:
            if response.status_code >= 400:
                response.read()
                self._json(response)
            for line in response.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def jobs(self, **filters: str) -> Iterator[dict[str, Any]]:
        """Your jobs, newest first, every page followed (filters: ``status``,
        ``batch_id``, ``created_from``, ``created_to``)."""
        return self._pages("/v1/jobs", filters)

    def batches(self, **filters: str) -> Iterator[dict[str, Any]]:
        """Your batches, newest first, every page followed (filters: ``name``,
        ``created_from``, ``created_to``)."""
        return self._pages("/v1/batches", filters)

    # -- changing course ------------------------------------------------------------------
    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job (again: no change). A finished one: ``Conflict``."""
        return self._json(self.http.post(f"/v1/jobs/{job_id}/cancel"))

    def retry(self, job_id: str) -> dict[str, Any]:
        """A failed or cancelled job runs again; anything else: ``Conflict``."""
        return self._json(self.http.post(f"/v1/jobs/{job_id}/retry"))

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        """Cancel what of the batch has not finished: {cancelled, stopping, kept}."""
        return self._json(self.http.post(f"/v1/batches/{batch_id}/cancel"))

    def resume_batch(self, batch_id: str) -> dict[str, Any]:
        """A cancelled batch's jobs wait again: {requeued, job_ids}."""
        return self._json(self.http.post(f"/v1/batches/{batch_id}/resume"))

    def retry_batch(self, batch_id: str, *, error: str | None = None) -> dict[str, Any]:
        """The batch's failed and cancelled jobs (of error code ``error``) run again; none:
        ``Conflict`` (``nothing_to_retry``)."""
        params = {"error": error} if error else None
        return self._json(self.http.post(f"/v1/batches/{batch_id}/retry", params=params))

    # -- webhooks ---------------------------------------------------------------------------
    def add_webhook(self, url: str, events: list[str] | None = None) -> dict[str, Any]:
        """Register an endpoint for your events (default: all); the answer holds the
        ``secret`` its deliveries are signed with (Standard Webhooks)."""
        body: dict[str, Any] = {"url": url, **({"events": events} if events else {})}
        return self._json(self.http.post("/v1/webhooks", json=body))

    def webhooks(self) -> list[dict[str, Any]]:
        return list(self._json(self.http.get("/v1/webhooks"))["data"])

    def remove_webhook(self, endpoint_id: str) -> None:
        response = self.http.delete(f"/v1/webhooks/{endpoint_id}")
        if response.status_code != 204:
            self._json(response)

    def webhook_secret(self) -> str:
        """The secret deliveries to your callback URLs are signed with."""
        return str(self._json(self.http.get("/v1/webhooks/secret"))["secret"])

    def deliveries(self, **filters: str) -> Iterator[dict[str, Any]]:
        """Your deliveries, newest first, each with its tries (filter: ``state``)."""
        return self._pages("/v1/webhooks/deliveries", filters)

    # -- internals ------------------------------------------------------------------------
    def _pages(self, path: str, filters: dict[str, str]) -> Iterator[dict[str, Any]]:
        after: str | None = None
        while True:
            params = {**filters, **({"after": after} if after else {})}
            page = self._json(self.http.get(path, params=params))
            yield from page["data"]
            after = page["next_cursor"]
            if after is None:
                return

    @staticmethod
    def _spec(job: dict[str, Any]) -> dict[str, Any]:
        spec = {k: v for k, v in job.items() if k != "image"}
        image = job.get("image")
        if image is not None:
            data = image if isinstance(image, bytes) else Path(image).read_bytes()
            spec["image_base64"] = base64.b64encode(data).decode()
        return spec

    @staticmethod
    def _json(response: httpx.Response) -> Any:
        if response.status_code < 400:
            return response.json()
        try:
            body = response.json()
            error, detail = body.get("error", "error"), body.get("detail", "")
        except ValueError:
            error, detail = "error", response.text[:500]
        status = response.status_code
        kind = _BY_STATUS.get(status, ServerError if status >= 500 else InvalidRequest)
        failure = kind(status, error, detail)
        if isinstance(failure, RateLimited):
            failure.retry_after_s = float(response.headers.get("retry-after", "1"))
        raise failure
