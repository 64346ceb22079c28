"""The one exception tree of SpecEyes.

Every error the service raises on purpose is a ``SpecEyesError``. Each boundary
(the funnel, a worker task, an HTTP route, the command line) catches this tree and
decides from the branch alone whether to fail the job or to retry it::

    SpecEyesError
    ├── PermanentError            the job itself is wrong: fail it, never retry
    │   ├── InvalidInput          a question, options or manifest row is malformed
    │   │   ├── NotFound          no such job or batch
    │   │   └── IdempotencyConflict  a client's key names a job with other content
    │   ├── ImageError            the image is missing, corrupt, too big or not an image
    │   └── AgentError            the agent loop ended without an answer (step limit, ...)
    ├── RetryableError            the world is wrong for now: retry the job later
    │   ├── BackendUnavailable    a model server or GPU could not serve the call
    │   └── Interrupted           the process is stopping (Ctrl-C): the job waits again
    ├── ModelError                a model failed on this job (kept per job, not fatal)
    └── ConfigurationError        the service is set up wrongly: stop at start-up

Each error carries a short machine-readable ``code`` that is stored with a failed
job (``image_error``, ``step_limit``, ...) next to its human message.
"""

from __future__ import annotations

from typing import Any


class SpecEyesError(Exception):
    """Base of every error SpecEyes raises on purpose."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class PermanentError(SpecEyesError):
    """The job cannot succeed as submitted; retrying changes nothing."""

    code = "permanent_error"


class InvalidInput(PermanentError):
    code = "invalid_input"


class NotFound(InvalidInput):
    code = "not_found"


class IdempotencyConflict(InvalidInput):
    code = "idempotency_conflict"


class ImageError(PermanentError):
    code = "image_error"


class AgentError(PermanentError):
    code = "agent_error"


class RetryableError(SpecEyesError):
    """A transient failure: the same job may succeed later."""

    code = "retryable_error"


class BackendUnavailable(RetryableError):
    code = "backend_unavailable"


class SourceUnavailable(RetryableError):
    """A corpus's store (S3, GCS, a web server) did not answer: its jobs wait and retry."""

    code = "source_unavailable"


class Interrupted(RetryableError):
    """A model call cut short because the process is stopping; its job is put back to
    wait, with no attempt counted."""

    code = "interrupted"


class StopRequested(SpecEyesError):
    """A trajectory stopped between two steps: its job was cancelled while it ran
    (``common.store.cancels``). Not a failure: the job is recorded as cancelled, with
    what its trajectory did before it stopped (``trajectory``, set by the agent loop)."""

    code = "cancelled"
    trajectory: Any = None


class ModelError(SpecEyesError):
    """A model call failed for one job (kept on that job; the batch goes on)."""

    code = "model_error"


class ConfigurationError(SpecEyesError):
    """Settings or model files are wrong; raised at start-up, not per job."""

    code = "configuration_error"
