"""The one settings object, composed of groups: each group is the view a component takes.

``Settings`` holds one group per part of the service, the way vLLM composes its
``VllmConfig``::

    Settings
    ├── models     the two models (large, small), the backend that runs them, its server
    ├── funnel     phases I-III: who screens, batch sizes, baseline and calibration runs
    ├── gate       phase III: the answer-separability gate
    ├── agent      phase IV: the agent loop, and (Thyme) its code sandbox
    ├── images     what an image may be before it is decoded
    ├── requests   what a job's texts may hold (API and command line)
    ├── broker     the distributed pipeline's queues
    ├── recovery   retries, heartbeats, the reconciler, the stall watchdog
    ├── api        ``speceyes serve``
    ├── audit      the online audit
    ├── judge      the LLM judge for benchmark answers
    └── database_url

Each field is written once, with its default, its checks and its description; from
there come its environment variable (``SPECEYES_`` and a flat name, the same names the
service always read: ``SPECEYES_GATE_THRESHOLD`` sets ``gate.threshold``), its
command-line flag where it has one (``cli.options``), and its row in
``docs/configuration.md`` (``configuration_markdown``; a test fails when the file is
stale). Values come from keyword arguments, then the environment, then a ``.env``
file, then the defaults. Nothing else in the code reads the environment.

The flat name of a field is its group's prefix and its own name (``gate_`` +
``threshold``), unless the field names it (``env``); a group's fields share a prefix
given where the group is placed (``env_prefix``), so the two models' fields read
``SPECEYES_LARGE_MODEL``, ``SPECEYES_SMALL_SERVER_URL``. What a calibration file says
of the audit, and the scripted backend's knobs for tests, are not settings.
"""

from __future__ import annotations

import functools
import json
import os
import re
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit, urlunsplit

from dotenv import dotenv_values
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from common.calibration_file import read_calibration

GateMode = Literal["min", "mean", "bottom20", "logprob"]
AgentKind = Literal["deepeyes", "thyme"]
BackendKind = Literal["transformers", "scripted", "openai"]
Screener = Literal["large", "small", "none"]
Method = Literal["speceyes", "specreason"]
Isolation = Literal["bubblewrap", "gvisor", "none"]
Role = Literal["large", "small"]
ENV_PREFIX = "SPECEYES_"


def setting(
    default: Any = ...,
    description: str | None = None,
    *,
    factory: Any = None,
    env: str | None = None,
    env_name: str | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    **checks: Any,
) -> Any:
    """A field with what the rest is built from: ``env``, its whole flat name where that
    is not the group's prefix + its own name (``env_name``: the part after the prefix);
    ``flag``, its command-line flag (``cli.options``)."""
    named = {"env": env, "env_name": env_name, "flag": flag, "metavar": metavar}
    extra: dict[str, Any] = {key: value for key, value in named.items() if value is not None}
    if factory is not None:
        return Field(
            default_factory=factory, description=description, json_schema_extra=extra, **checks
        )
    return Field(default, description=description, json_schema_extra=extra, **checks)


def group(
    factory: Any,
    description: str,
    *,
    env_prefix: str | None = None,
    flags: dict[str, str] | None = None,
) -> Any:
    """A group placed in its parent; its fields' flat names start with ``env_prefix``
    (where given, else the parent's); ``flags`` names flags of its fields that depend on
    where it is placed (the two models' ``--large``, ``--small``)."""
    extra: dict[str, Any] = {} if env_prefix is None else {"env_prefix": env_prefix}
    if flags:
        extra["flags"] = flags
    return Field(default_factory=factory, description=description, json_schema_extra=extra)


class Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        _no_stray_names(self, update)
        return super().model_copy(update=update, deep=deep)


def _no_stray_names(model: BaseModel, update: Mapping[str, Any] | None) -> None:
    """pydantic's ``model_copy`` sets any name it is given, a field or not, unchecked:
    ``settings.model_copy(update={"baseline": True})`` would change nothing the code
    reads (``baseline`` is ``funnel.baseline``). Refuse it; ``Settings.replace`` takes flat
    names and paths, and checks the values."""
    stray = sorted(set(update or ()) - set(type(model).model_fields))
    if stray:
        raise TypeError(
            f"{type(model).__name__} has no field {', '.join(stray)}: use Settings.replace"
        )


# -- the groups ------------------------------------------------------------------------
class ModelSettings(Group):
    """One of the two models: what it is, and where it is served (backend ``openai``)."""

    name: str = setting(
        description="A Hugging Face id, a local checkpoint folder, "
        "'synth' (trained on SpecEyes-Synth, shipped) or 'tiny' (random "
        "weights, built offline).",
        env_name="model",
        metavar="MODEL",
    )
    server_url: str | None = setting(
        None, "Its OpenAI-compatible server, e.g. http://gpu-1:8000/v1, serving it by name."
    )
    server_key: SecretStr | None = setting(None, "That server's key (never printed).")


DEFAULT_MODELS = {"large": "ChenShawn/DeepEyes-7B", "small": "Qwen/Qwen3-VL-2B-Instruct"}


class ModelsSettings(Group):
    """The two models and what runs them."""

    large: ModelSettings = group(
        lambda: ModelSettings(name=DEFAULT_MODELS["large"]),
        "M_L, the agentic model (a Qwen2.5-VL).",
        env_prefix="large_",
        flags={"name": "--large"},
    )
    small: ModelSettings = group(
        lambda: ModelSettings(name=DEFAULT_MODELS["small"]),
        "M_S, the tool-free speculative model (a Qwen3-VL); its server defaults to M_L's.",
        env_prefix="small_",
        flags={"name": "--small"},
    )
    backend: BackendKind = setting(
        "transformers",
        "'transformers' runs the checkpoints in this process; 'openai' "
        "calls them behind OpenAI-compatible servers; 'scripted' is a deterministic "
        "stand-in for tests and throughput experiments.",
        env="backend",
        flag="--backend",
    )
    protocol: Literal["auto", "reference", "v0"] = setting(
        "auto",
        "What the models are shown (prompts, stops, tool-loop rules, image grid): "
        "'reference' is the SpecEyes evaluation's, 'v0' SpecEyes' first wording. 'auto': a "
        "checkpoint that names its protocol (speceyes.json) gets it, others 'reference'. "
        "Naming one a checkpoint was not trained with is an error.",
        env="protocol",
        flag="--protocol",
    )
    device: str = setting(
        "auto",
        "'auto' (cuda if present, else cpu), 'cpu', 'cuda:0', ...",
        env="device",
        flag="--device",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = setting(
        "auto", "'auto' is bfloat16 on a GPU and float32 on the CPU.", env="dtype", flag="--dtype"
    )
    cache_dir: Path = setting(
        Path("~/.cache/speceyes"), "Where built tiny checkpoints are kept.", env="cache_dir"
    )
    server_timeout_s: float = setting(
        120.0, "Seconds per request to a model server.", env="server_timeout_s", gt=0
    )
    server_retries: int = setting(
        3,
        "Retries of a request a model server refused for now "
        "(429, 5xx, a lost connection), with backoff.",
        env="server_retries",
        ge=0,
    )
    server_concurrency: int = setting(
        16,
        "Requests in flight at once to a model server, per micro-batch.",
        env="server_concurrency",
        ge=1,
    )

    @model_validator(mode="before")
    @classmethod
    def _default_names(cls, values: Any) -> Any:
        """A model given in part (its server only) is still the default model."""
        if isinstance(values, dict):
            for role, name in DEFAULT_MODELS.items():
                if isinstance(values.get(role), dict) and "name" not in values[role]:
                    values[role] = {**values[role], "name": name}
        return values

    @field_validator("cache_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    def role(self, role: Role) -> ModelSettings:
        return self.large if role == "large" else self.small


class GateSettings(Group):
    """Phase III; stored with every gated job."""

    mode: GateMode = setting(
        "min",
        "Aggregation of per-token separability: 'min', 'mean', "
        "'bottom20', or 'logprob' (the baseline).",
        flag="--mode",
    )
    top_k: int = setting(
        64, "K: logits kept per token for the gate.", flag="--top-k", metavar="K", ge=2
    )
    threshold: float = setting(
        0.98,
        "tau: accept iff confidence > tau (Thyme: 0.95).",
        flag="--threshold",
        metavar="TAU",
        gt=0.0,
        lt=1.0,
    )


class FunnelSettings(Group):
    """Phases I-III: who screens, how jobs are batched, and runs that change the funnel."""

    screener: Screener = setting(
        "large",
        "Who screens in phase I: 'large' (the paper), 'small' (the paper's "
        "ablation) or 'none' (every job is speculated).",
        flag="--screener",
    )
    baseline: bool = setting(
        False,
        "No speculation: every job runs the agent (for speedup baselines).",
        flag="--baseline",
    )
    method: Method = setting(
        "speceyes",
        "'speceyes' (the funnel) or 'specreason' (the paper's comparison arm: "
        "every job skips phases I-III and runs SpecReason's step-level speculation in the "
        "agent stage; docs/protocols.md).",
        flag="--method",
    )
    specreason_threshold: float = setting(
        7.0,
        "SpecReason: a small model's step the large model scores at least this (0-9) is "
        "kept (the reference's --score_threshold).",
        flag="--score-threshold",
        metavar="S",
        ge=0.0,
        le=10.0,
    )
    calibrate: bool = setting(
        False,
        "A calibration run: every job is speculated (keeping the top 128 logits per "
        "token) AND runs the agent, so any gate can be replayed later without a model "
        "(speceyes calibrate).",
        flag="--calibrate",
    )
    screen_max_new_tokens: int = setting(10, "New tokens of a phase-I answer (yes/no).", ge=1)
    speculate_max_new_tokens: int = setting(20, "New tokens of the small model's answer.", ge=1)
    fast_batch_size: int = setting(
        32, "Largest micro-batch of phases I-III.", flag="--batch-size", metavar="N", ge=1
    )
    fast_max_wait_s: float = setting(
        0.5, "Distributed fast pool: longest wait to fill a batch.", ge=0.0
    )
    fast_batch_pixels: int = setting(
        256_000_000,
        "Most image pixels a fast micro-batch decodes at once (3-4 bytes each); "
        "a batch of larger images runs in smaller groups.",
        ge=1,
    )
    gate: GateSettings = group(
        lambda: GateSettings(), "Phase III: the answer-separability gate.", env_prefix="gate_"
    )

    @model_validator(mode="after")
    def _one_method(self) -> Self:
        if self.method == "specreason" and (self.baseline or self.calibrate):
            raise ValueError(
                "method 'specreason' runs no funnel: it cannot be a baseline or a "
                "calibration run as well"
            )
        return self


class SandboxSettings(Group):
    """Where Thyme's model-written code runs, and what one execution may spend
    (``common.sandbox``; the design and its guarantees: docs/sandbox.md)."""

    isolation: Isolation = setting(
        "bubblewrap",
        "What isolates the code: 'bubblewrap' (namespaces, seccomp, a control "
        "group) or 'gvisor' (the same guest under gVisor's kernel, runsc). 'none' only "
        "with allow_unsandboxed_code.",
    )
    allow_unsandboxed_code: bool = setting(
        False,
        "DANGER: run Thyme's model-written code without isolation (still a separate "
        "process with limits and seccomp, but it can read this machine's files and reach its "
        "network). Only where bubblewrap cannot run.",
        env="allow_unsandboxed_code",
    )
    wall_s: float = setting(10.0, "Wall clock of one code execution.", gt=0)
    cpu_s: int = setting(10, "CPU seconds of one code execution.", ge=1)
    memory_mb: int = setting(
        2048,
        "Memory of one sandbox: its processes and the files it writes together (a "
        "control group), and the address space of its process.",
        ge=256,
    )
    disk_mb: int = setting(256, "Bytes the code may keep in its folders (/mnt/data, /tmp).", ge=16)
    files: int = setting(4096, "Files and folders the code may keep in its folders.", ge=64)
    open_files: int = setting(64, "Files one execution may have open at once.", ge=16)
    file_mb: int = setting(64, "The largest file the code may write.", ge=1)
    threads: int = setting(
        32, "Tasks of one sandbox (threads; new processes are refused in any case).", ge=2
    )
    output_bytes: int = setting(1 << 20, "Most bytes one execution may print and report.", ge=1024)
    text_chars: int = setting(
        16_384,
        "Most characters of printed text one execution hands back to the model (the "
        "rest is cut: a print is not a way to flood the model's context).",
        ge=256,
    )
    max_images: int = setting(
        4, "Images one execution may hand back to the model (the first).", ge=1
    )
    image_pixels: int = setting(
        40_000_000,
        "Pixels of the images one execution saves and hands back, together, as the "
        "sandbox decodes them (in its own memory); each is then resized to the model's "
        "grid there, and the host holds only that.",
        ge=1,
    )
    view_tokens: int = setting(
        32_768,
        "Visual tokens (28 x 28 pixels each, on the model's grid) the images the code "
        "hands back may hold over one trajectory, together: past it an image is left "
        "out, which the step's observation says. It bounds what the worker holds for "
        "them (about 7 bytes a pixel while an execution's images arrive, 4 while the "
        "conversation keeps them).",
        ge=4,
    )
    io_mb_s: int = setting(
        64,
        "Disk reads and writes of one sandbox, MB a second each way on each block "
        "device (a control group's I/O throttle, where the machine has the controller).",
        ge=1,
    )
    io_ops_s: int = setting(
        1000, "Disk operations of one sandbox a second, each way on each block device.", ge=1
    )
    uid: int = setting(
        65533,
        "The unprivileged uid (and gid) code runs as where the worker "
        "is root; no account on the machine may use it.",
        ge=1,
    )
    bwrap: str = setting("bwrap", "The bubblewrap executable.")
    runsc: str = setting("runsc", "gVisor's runsc executable.")

    @property
    def effective_isolation(self) -> Isolation:
        return "none" if self.allow_unsandboxed_code else self.isolation


class AgentSettings(Group):
    """Phase IV: the agent loop, what one trajectory may spend, where its code runs."""

    kind: AgentKind = setting(
        "deepeyes",
        "The large model's agent: 'deepeyes' (zoom tool calls) or 'thyme' (it "
        "writes Python, run in the code sandbox). Thyme changes the defaults of "
        "gate.threshold (0.95), agent.max_steps (5) and agent.max_new_tokens (2048) to the "
        "reference's values for it.",
        env="agent",
        flag="--agent",
    )
    max_steps: int = setting(
        6, "Generations per trajectory (Thyme: 5).", flag="--max-steps", metavar="N", ge=1
    )
    max_new_tokens: int = setting(512, "New tokens per agent step (Thyme: 2048).", ge=1)
    workers: int = setting(
        1,
        "Trajectories run at once (one per model replica is the norm).",
        flag="--agent-workers",
        metavar="N",
        ge=1,
    )
    step_wait_s: float = setting(
        0.1,
        "With agent.workers > 1, in-process: how long one trajectory's step waits for "
        "the others' to share its batched generate. Longer fills batches; shorter loses "
        "less when the others are busy in a tool.",
        ge=0,
    )
    min_box_side: int | None = setting(
        None,
        "Zoom boxes with a side <= this are refused (an error goes back to the model). "
        "Unset: the protocol's (reference: none; v0: 30, as DeepEyes' training).",
        env="min_box_side",
        ge=0,
    )
    max_box_aspect: float | None = setting(
        None,
        "Zoom boxes with a longer aspect ratio are refused. Unset: the protocol's "
        "(reference: none; v0: 100).",
        env="max_box_aspect",
        gt=1.0,
    )
    sandbox: SandboxSettings = group(
        SandboxSettings, "Thyme's code sandbox.", env_prefix="sandbox_"
    )


class ImageSettings(Group):
    """Limits checked before an image is decoded (decompression bombs) and after."""

    max_bytes: int = setting(50 * 1024 * 1024, "Largest image file.", env="max_image_bytes", ge=1)
    max_pixels: int = setting(
        100_000_000,
        "Most pixels an image may declare (checked before it is decoded).",
        env="max_image_pixels",
        ge=1,
    )
    max_aspect_ratio: float = setting(
        200.0,
        "Longest side / shortest side (Qwen's smart resize refuses more).",
        env="max_image_aspect",
        gt=1.0,
    )
    exif_rotate: bool = setting(
        True,
        "Turn an image as its EXIF orientation says (right for photographs; recorded in "
        "the job key). The reference never does: the benchmark readers keep each image "
        "as the reference sees it, whatever this says.",
        env="exif_rotate",
    )


class SourceSettings(Group):
    """Corpora read by ``annotate`` (``common.corpus``) and exported back."""

    copy_images: bool = setting(
        False,
        "Copy every image of a corpus into the upload store (api.upload_dir) as it is "
        "submitted, for sources the workers cannot reach. Off: a job refers to its image "
        "where it lies (a file, a tar member, a table row, a remote object).",
        env="copy_images",
        flag="--copy-images",
    )
    submit_rows: int = setting(
        5000,
        "Rows read, hashed and written to the store per transaction while submitting "
        "(memory holds one such chunk; its jobs are sent once it commits).",
        ge=1,
    )
    export_shard_rows: int = setting(
        100_000,
        "Rows per Parquet file when results go to a folder or prefix (--out DIR/).",
        flag="--shard-rows",
        ge=1,
    )


class RequestLimits(Group):
    """What one job's texts may hold (``common.limits`` checks them; API and CLI)."""

    max_question_chars: int = setting(2000, "Longest question.", ge=1)
    max_options: int = setting(
        26, "Most multiple-choice options (the letters run A-Z).", ge=2, le=26
    )
    max_option_chars: int = setting(1000, "Longest multiple-choice option.", ge=1)
    max_id_chars: int = setting(1000, "Longest row id, image path or known answer.", ge=1)
    max_name_chars: int = setting(200, "Longest batch name (the column's width).", ge=1, le=200)


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
        "A waiting job with no message on the broker for this long is sent again "
        "(messages lost with a Redis restart, an enqueue that failed).",
        gt=0.0,
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

    @field_validator("upload_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()


class AuditSettings(Group):
    """The online audit: a share of accepted answers also runs through the agent."""

    rate: float = setting(
        0.02,
        "Share of accepted answers also run through the agent (chosen by a hash of the "
        "job's key: reruns audit the same jobs); 0: no audit.",
        flag="--audit-rate",
        metavar="SHARE",
        ge=0.0,
        le=1.0,
    )
    floor: float = setting(
        0.9,
        "The agreement the audit expects when no calibration file gives one; an alarm "
        "when the agreement's interval falls below it.",
        gt=0.0,
        le=1.0,
    )
    on_drift: Literal["warn", "raise-tau", "pause"] = setting(
        "warn",
        "On a drift alarm: warn only; raise tau to the calibration's next step; or "
        "pause accepting (every new job to the agent) until `speceyes audit resume`.",
        flag="--on-drift",
    )


class JudgeSettings(Group):
    """An LLM judge for benchmark answers the reference's rules leave undecided."""

    url: str | None = setting(
        None,
        "OpenAI-compatible endpoint (…/v1) of the judge; unset: no judge (undecided "
        "answers count as wrong).",
        flag="--judge-url",
        metavar="URL",
    )
    model: str | None = setting(
        None, "The judge's model name at that endpoint.", flag="--judge-model", metavar="NAME"
    )
    api_key: SecretStr | None = setting(None, "The judge endpoint's key (never logged).")
    timeout_s: float = setting(120.0, "Seconds per judge request.", gt=0.0)
    concurrency: int = setting(8, "Judge requests in flight at once.", ge=1)


# the reference's values for Thyme (eval_code_thyme: SpecEyes.py --score_threshold,
# utils.py MAX_ITERATIONS and MAX_NEW_TOKENS_PER_STEP): (group, field) -> value
THYME_DEFAULTS: dict[str, Any] = {
    "funnel.gate.threshold": 0.95,
    "agent.max_steps": 5,
    "agent.max_new_tokens": 2048,
}


class Settings(BaseSettings):
    """SpecEyes configuration (see the module's text)."""

    model_config = SettingsConfigDict(extra="ignore", validate_default=True)

    models: ModelsSettings = group(ModelsSettings, "The two models and what runs them.")
    funnel: FunnelSettings = group(FunnelSettings, "Phases I-III, the gate among them.")
    agent: AgentSettings = group(AgentSettings, "Phase IV: the agent.", env_prefix="agent_")
    images: ImageSettings = group(ImageSettings, "Images before they are decoded.")
    requests: RequestLimits = group(RequestLimits, "What a job's texts may hold.")
    sources: SourceSettings = group(SourceSettings, "Corpora in and results out.")
    broker: BrokerSettings = group(
        BrokerSettings, "The distributed pipeline's broker.", env_prefix="broker_"
    )
    recovery: RecoverySettings = group(RecoverySettings, "Riding out faults.")
    api: ApiSettings = group(ApiSettings, "The HTTP API.", env_prefix="api_")
    audit: AuditSettings = group(AuditSettings, "The online audit.", env_prefix="audit_")
    judge: JudgeSettings = group(JudgeSettings, "The LLM judge.", env_prefix="judge_")
    database_url: str = setting(
        "sqlite:///speceyes.db", "SQLAlchemy URL of the job store.", flag="--db", metavar="URL"
    )
    calibration_file: Path | None = setting(
        None,
        "A calibration file (speceyes calibrate --out): the gate it chose (where no gate "
        "setting is given) and the agreement the audit then expects.",
        flag="--calibration",
        metavar="FILE",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        given = getattr(init_settings, "init_kwargs", {})
        return InitSettingsSource(settings_cls, nest_flat(dict(given))), FlatEnvironment(
            settings_cls
        )

    @model_validator(mode="after")
    def _calibrated_gate(self) -> Settings:
        """A calibration file's gate, where no gate setting is given (field by field)."""
        if self.calibration_file is not None:
            chosen = read_calibration(self.calibration_file).gate
            current = self.funnel.gate
            given = current.model_fields_set if "gate" in self.funnel.model_fields_set else set()
            gate = GateSettings(**{**chosen, **{name: getattr(current, name) for name in given}})
            object.__setattr__(self, "funnel", self.funnel.model_copy(update={"gate": gate}))
            self.__pydantic_fields_set__.add("funnel")  # (given, by the file)
        return self

    @model_validator(mode="after")
    def _agent_defaults(self) -> Settings:
        """Thyme's reference values where the operator set none."""
        if self.agent.kind == "thyme":
            for path, value in THYME_DEFAULTS.items():
                if not _was_set(self, path):
                    first, *rest = path.split(".")
                    object.__setattr__(self, first, _updated(getattr(self, first), rest, value))
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        _no_stray_names(self, update)
        return super().model_copy(update=update, deep=deep)

    def replace(self, **values: Any) -> Settings:
        """These settings with some changed, by flat name (``baseline=True``) or by path
        (``**{"funnel.baseline": True}``); checked as any setting is."""
        return Settings(**_merged(self.model_dump(), nest_flat(dict(values))))


def nest_flat(values: dict[str, Any]) -> dict[str, Any]:
    """Settings given by flat name (``Settings(gate_threshold=0.9)``, as
    ``SPECEYES_GATE_THRESHOLD=0.9``) or by path, as the nested dict pydantic takes; a
    group given whole (a dict, a model) stays as it is."""
    paths = flat_paths()
    moved = {}
    for key in list(values):
        whole_group = key in Settings.model_fields and isinstance(values[key], dict | BaseModel)
        if "." in key or (key in paths and not whole_group):
            moved[paths.get(key, key)] = values.pop(key)
    return nested(moved, values)


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merged(base[key], value)
        else:
            base[key] = value
    return base


def _updated(node: BaseModel, parts: list[str], value: Any) -> BaseModel:
    """A copy of ``node`` with the field at ``parts`` (a path below it) set to ``value``."""
    first, *rest = parts
    return node.model_copy(
        update={first: _updated(getattr(node, first), rest, value) if rest else value}
    )


def _was_set(settings: BaseModel, path: str) -> bool:
    """Whether the setting at ``path`` was given (by any source), not defaulted."""
    *groups, name = path.split(".")
    node: BaseModel = settings
    for part in groups:
        if part not in node.model_fields_set:
            return False
        node = getattr(node, part)
    return name in node.model_fields_set


# -- one source for the environment, the flags and the docs ------------------------------
@dataclass(frozen=True)
class Leaf:
    """One setting: where it sits, its field, its flat name, what its group adds."""

    path: str  # "funnel.gate.threshold"
    field: FieldInfo
    env: str  # "SPECEYES_GATE_THRESHOLD"
    placed: dict[str, Any]  # what its placement says of it (a flag)

    @property
    def extra(self) -> dict[str, Any]:
        extra = self.field.json_schema_extra
        return {**(extra if isinstance(extra, dict) else {}), **self.placed}


def leaves(
    model: type[BaseModel] | None = None,
    path: str = "",
    prefix: str = "",
    flags: dict[str, str] | None = None,
) -> Iterator[Leaf]:
    """Every setting under ``model`` (default: all), in order, with its flat name."""
    for name, field in (model or Settings).model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        kind = _group_type(field.annotation)
        where = f"{path}{name}"
        if kind is not None:
            inner = extra.get("flags")
            below = str(extra.get("env_prefix", prefix))
            named = (
                {str(key): str(value) for key, value in inner.items()}
                if isinstance(inner, dict)
                else None
            )
            yield from leaves(kind, f"{where}.", below, named)
            continue
        flat = extra.get("env") or prefix + str(extra.get("env_name", name))
        placed = {"flag": flags[name]} if flags and name in flags else {}
        yield Leaf(where, field, ENV_PREFIX + str(flat).upper(), placed)


@functools.cache
def flat_paths() -> dict[str, str]:
    """Flat name (``gate_threshold``) -> path (``funnel.gate.threshold``), for every setting."""
    return {leaf.env[len(ENV_PREFIX) :].lower(): leaf.path for leaf in leaves()}


def _group_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def nested(values: dict[str, Any], into: dict[str, Any] | None = None) -> dict[str, Any]:
    """Values by dotted path (``{"gate.threshold": 0.9}``) as the nested dict pydantic takes."""
    tree: dict[str, Any] = into if into is not None else {}
    for path, value in values.items():
        *parents, last = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


class FlatEnvironment(PydanticBaseSettingsSource):
    """Settings from ``SPECEYES_<FLAT NAME>`` variables, then a ``.env`` file."""

    def __call__(self) -> dict[str, Any]:
        found = {**dotenv_values(".env"), **os.environ} if Path(".env").is_file() else os.environ
        values: dict[str, Any] = {}
        for leaf in leaves(self.settings_cls):
            raw = found.get(leaf.env)
            if raw is not None:
                values[leaf.path] = json.loads(raw) if _is_structured(leaf.field) else raw
        return nested(values)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # (the whole tree is read in __call__)


def _is_structured(field: FieldInfo) -> bool:
    """A list or dict field, whose variable holds JSON."""
    annotation = field.annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(typing.get_origin(arg) in (list, dict) for arg in typing.get_args(annotation))
    return origin in (list, dict)


def default_of(path: str) -> Any:
    """A setting's default as written, by path (``~`` not expanded: it is shown)."""
    field = next(leaf.field for leaf in leaves() if leaf.path == path)
    if not field.is_required():
        return field.get_default(call_default_factory=True)
    first, *rest = path.split(".")  # (a model's name: its group's placement gives it)
    value = Settings.model_fields[first].get_default(call_default_factory=True)
    for part in rest:
        value = getattr(value, part)
    return value


def without_password(value: str) -> str:
    """A URL with its password shown as stars (``postgresql://u:***@host/db``, and a
    ``password=`` in its query); any other text as it is. Settings and messages print
    URLs through this."""
    if "://" not in value:
        return value
    try:
        parsed = urlsplit(value)
        password = parsed.password
    except ValueError:  # not a URL after all; it may still hold one's secret
        return "***" if "@" in value or "password" in value else value
    query = re.sub(r"(?i)(password=)[^&]*", r"\1***", parsed.query)
    if password is None and query == parsed.query:
        return value  # (rebuilt, sqlite:///x.db would lose a slash)
    if password is not None:
        parsed = parsed._replace(netloc=parsed.netloc.replace(f":{password}@", ":***@", 1))
    return urlunsplit(parsed._replace(query=query))


def configuration_markdown() -> str:
    """docs/configuration.md: every setting, its variable, default, flag and meaning."""
    lines = [
        "# Configuration",
        "",
        "Generated from `common/config.py` by `speceyes config --markdown` (a test fails when",
        "this page is stale). Each setting is read from its `SPECEYES_` variable (or a",
        "`.env` file in the working folder), some also from a flag of the commands that take",
        "them (see each command's `--help`); a flag beats the variable, which beats the",
        "default. `speceyes config` prints the values in effect. Lists are JSON.",
    ]
    section = None
    for leaf in leaves():
        top = leaf.path.split(".")[0] if "." in leaf.path else ""
        if top != section:
            section = top
            described = Settings.model_fields[top].description if top else None
            lines += ["", f"## {top or 'the store'}", ""]
            lines += [described, ""] if described else []
            lines += [
                "| setting | variable | default | flag | what it is |",
                "|---|---|---|---|---|",
            ]
        flag = leaf.extra.get("flag")
        meaning = (leaf.field.description or "").replace("|", "/")
        lines.append(
            f"| `{leaf.path}` | `{leaf.env}` | {_shown(default_of(leaf.path))} | "
            f"{f'`{flag}`' if flag else ''} | {meaning} |"
        )
    return "\n".join(lines) + "\n"


def _shown(value: Any) -> str:
    if value is None or value == [] or value == "":
        return "unset" if value is None or value == [] else "empty"
    if isinstance(value, Path):
        return f"`{value}`"
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"
