"""The one settings object. Every knob of the service is a field here.

Values come from keyword arguments, then ``SPECEYES_*`` environment variables, then a
``.env`` file, then the defaults below (``SPECEYES_GATE_THRESHOLD=0.97`` sets
``gate_threshold``). Nothing else in the code reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

GateMode = Literal["min", "mean", "bottom20", "logprob"]
AgentKind = Literal["deepeyes", "thyme"]
BackendKind = Literal["transformers", "scripted", "openai"]
Screener = Literal["large", "small", "none"]


class ScriptedSettings(BaseModel):
    """The scripted backend's behaviour, for tests and throughput experiments.

    Jobs are drawn deterministically from their id: a share ``tool_free`` is screened
    tool-free, and of those a share ``confident`` passes the gate. Simulated costs are
    slept: a fast-stage call costs ``fast_batch_s`` + ``fast_job_s`` per job (half in
    screening, half in speculation), an agent step ``agent_step_s``.
    """

    tool_free: float = Field(1.0, ge=0.0, le=1.0)
    confident: float = Field(1.0, ge=0.0, le=1.0)
    fast_batch_s: float = Field(0.0, ge=0.0)
    fast_job_s: float = Field(0.0, ge=0.0)
    agent_step_s: float = Field(0.0, ge=0.0)
    scripts_file: Path | None = Field(
        None,
        description="JSON object: job id -> that job's script (JobScript's fields); the key "
        "'*' scripts every other job (e.g. chosen Thyme code for a whole corpus, to replay "
        "an attack through annotate or the workers).",
    )


class Settings(BaseSettings):
    """SpecEyes configuration. Environment prefix: ``SPECEYES_``."""

    model_config = SettingsConfigDict(
        env_prefix="SPECEYES_",
        env_file=".env",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    # -- models -------------------------------------------------------------------
    small_model: str = Field(
        "Qwen/Qwen3-VL-2B-Instruct",
        description="M_S, the tool-free speculative model: a Hugging Face id, a local "
        "checkpoint folder, or 'tiny' (a random-weight Qwen3-VL built offline).",
    )
    large_model: str = Field(
        "ChenShawn/DeepEyes-7B",
        description="M_L, the agentic model: a Hugging Face id, a local folder, or 'tiny' "
        "(a random-weight Qwen2.5-VL built offline).",
    )
    agent: AgentKind = Field(
        "deepeyes",
        description="The large model's agent: 'deepeyes' (zoom tool calls) or 'thyme' (it "
        "writes Python, run in the code sandbox). Thyme changes the defaults of "
        "gate_threshold (0.95), agent_max_steps (5) and agent_max_new_tokens (2048) to "
        "the reference's values for it.",
    )
    protocol: Literal["auto", "reference", "v0"] = Field(
        "auto",
        description="What the models are shown (prompts, stops, tool-loop rules, image "
        "grid): 'reference' is the SpecEyes evaluation's, 'v0' SpecEyes' first wording. "
        "'auto': a checkpoint that names its protocol (speceyes.json) gets it, others "
        "'reference'. Naming one a checkpoint was not trained with is an error.",
    )
    backend: BackendKind = Field(
        "transformers",
        description="'transformers' runs real checkpoints; 'scripted' is "
        "a deterministic stand-in for tests and throughput experiments.",
    )
    device: str = Field(
        "auto", description="'auto' (cuda if present, else cpu), 'cpu', 'cuda:0', ..."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="'auto' is bfloat16 on a GPU and float32 on the CPU."
    )
    cache_dir: Path = Field(
        Path("~/.cache/speceyes"), description="Where built tiny checkpoints are kept."
    )

    # -- the funnel ---------------------------------------------------------------
    baseline: bool = Field(
        False, description="No speculation: every job runs the agent (for speedup baselines)."
    )
    calibrate: bool = Field(
        False,
        description="A calibration run: every job is speculated (keeping the top "
        "128 logits per token) AND runs the agent, so any gate can be replayed later "
        "without a model (speceyes calibrate).",
    )
    screener: Screener = Field(
        "large",
        description="Who screens in phase I: 'large' (the paper), 'small' (the "
        "paper's ablation) or 'none' (every job is speculated).",
    )
    gate_mode: GateMode = Field("min", description="Aggregation of per-token separability.")
    gate_top_k: int = Field(64, ge=2, description="K: logits kept per token for the gate.")
    gate_threshold: float = Field(
        0.98, gt=0.0, lt=1.0, description="tau: accept iff confidence > tau (Thyme: 0.95)."
    )
    screen_max_new_tokens: int = Field(10, ge=1)
    speculate_max_new_tokens: int = Field(20, ge=1)
    agent_max_steps: int = Field(6, ge=1, description="Generations per trajectory (Thyme: 5).")
    agent_max_new_tokens: int = Field(
        512, ge=1, description="New tokens per agent step (Thyme: 2048)."
    )
    fast_batch_size: int = Field(32, ge=1, description="Largest micro-batch of phases I-III.")
    fast_max_wait_s: float = Field(
        0.5, ge=0.0, description="Distributed fast pool: longest wait to fill a batch."
    )
    agent_workers: int = Field(
        1, ge=1, description="Trajectories run at once (one per model replica is the norm)."
    )
    scripted: ScriptedSettings = Field(
        default_factory=ScriptedSettings,
        description="Scripted backend only: shares and simulated costs "
        "(SPECEYES_SCRIPTED__TOOL_FREE=0.7, ...).",
    )

    # -- models behind an OpenAI-compatible server (backend "openai") ----------------
    large_server_url: str | None = Field(
        None, description="M_L's server, e.g. http://gpu-1:8000/v1 (served as large_model)."
    )
    small_server_url: str | None = Field(
        None, description="M_S's server (unset: the large model's), served as small_model."
    )
    large_server_key: SecretStr | None = Field(None, description="M_L's server key.")
    small_server_key: SecretStr | None = Field(None, description="M_S's server key.")
    server_timeout_s: float = Field(120.0, gt=0, description="Per request.")
    server_retries: int = Field(
        3, ge=0, description="Retries on 429, 5xx and lost connections, with backoff."
    )
    server_concurrency: int = Field(
        16, ge=1, description="Requests in flight at once, per micro-batch."
    )

    # -- the code sandbox (Thyme) ---------------------------------------------------
    sandbox_isolation: Literal["bubblewrap", "gvisor"] = Field(
        "bubblewrap",
        description="What isolates Thyme's code: 'bubblewrap' (namespaces, seccomp, a "
        "control group) or 'gvisor' (the same guest under gVisor's kernel, runsc).",
    )
    sandbox_wall_s: float = Field(10.0, gt=0, description="Wall clock of one code execution.")
    sandbox_cpu_s: int = Field(10, ge=1, description="CPU seconds of one code execution.")
    sandbox_memory_mb: int = Field(
        2048,
        ge=256,
        description="Memory of one sandbox: its processes and the files it writes "
        "together (a control group), and the address space of its process.",
    )
    sandbox_disk_mb: int = Field(
        256, ge=16, description="Bytes the code may keep in its folders (/mnt/data, /tmp)."
    )
    sandbox_files: int = Field(
        4096, ge=64, description="Files and folders the code may keep in its folders."
    )
    sandbox_output_bytes: int = Field(
        1 << 20, ge=1024, description="Most bytes one execution may print and report."
    )
    sandbox_text_chars: int = Field(
        16_384,
        ge=256,
        description="Most characters of printed text one execution hands back to the model "
        "(the rest is cut: a print is not a way to flood the model's context).",
    )
    sandbox_max_images: int = Field(
        4, ge=1, description="Images one execution may hand back to the model (the first)."
    )
    sandbox_image_pixels: int = Field(
        40_000_000,
        ge=1,
        description="Pixels of the images one execution hands back, together (the host "
        "holds them as RGB: 3 bytes each, twice at most).",
    )
    sandbox_uid: int = Field(
        65533,
        ge=1,
        description="The unprivileged uid (and gid) code runs as where the worker is root; "
        "no account on the machine may use it.",
    )
    sandbox_bwrap: str = Field("bwrap", description="The bubblewrap executable.")
    sandbox_runsc: str = Field("runsc", description="gVisor's runsc executable.")
    allow_unsandboxed_code: bool = Field(
        False,
        description="DANGER: run Thyme's model-written code without bubblewrap (still a "
        "separate process with limits and seccomp, but it can read this machine's files "
        "and reach its network). Only where bubblewrap cannot run.",
    )

    # -- images -------------------------------------------------------------------
    max_image_bytes: int = Field(50 * 1024 * 1024, ge=1)
    max_image_pixels: int = Field(100_000_000, ge=1)
    fast_batch_pixels: int = Field(
        256_000_000,
        ge=1,
        description="Most image pixels a fast micro-batch decodes at once (3-4 bytes each); a "
        "batch of larger images runs in smaller groups.",
    )
    min_box_side: int | None = Field(
        None,
        ge=0,
        description="Zoom boxes with a side <= this are refused (an error goes back to the "
        "model). Unset: the protocol's (reference: none; v0: 30, as DeepEyes' training).",
    )
    max_box_aspect: float | None = Field(
        None,
        gt=1.0,
        description="Zoom boxes with a longer aspect ratio are refused. Unset: the "
        "protocol's (reference: none; v0: 100).",
    )

    # -- the online audit --------------------------------------------------------------
    audit_rate: float = Field(
        0.02,
        ge=0.0,
        le=1.0,
        description="Share of accepted answers also run through the agent (chosen by a hash "
        "of the job's key: reruns audit the same jobs); 0: no audit.",
    )
    audit_floor: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="The agreement the audit expects when no calibration file gives one; "
        "an alarm when the agreement's interval falls below it.",
    )
    audit_baseline: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="The agreement the calibration run measured (set by --calibration).",
    )
    audit_tau_steps: list[float] = Field(
        default_factory=list,
        description="Stricter taus to raise to on drift (set by --calibration), nearest first.",
    )
    audit_on_drift: Literal["warn", "raise-tau", "pause"] = Field(
        "warn",
        description="On a drift alarm: warn only; raise tau to the calibration's next step; "
        "or pause accepting (every new job to the agent) until `speceyes audit resume`.",
    )
    audit_queue: str = Field(
        "speceyes.audit", description="Queue of audit runs (taken after deferred jobs)."
    )

    # -- evaluation -------------------------------------------------------------------
    judge_url: str | None = Field(
        None,
        description="OpenAI-compatible endpoint (…/v1) of an LLM judge for benchmark answers "
        "the reference's rules leave undecided; unset: no judge (they count as wrong).",
    )
    judge_model: str | None = Field(None, description="The judge's model name at that endpoint.")
    judge_api_key: SecretStr | None = Field(
        None, description="The judge endpoint's key (SPECEYES_JUDGE_API_KEY; never logged)."
    )
    judge_timeout_s: float = Field(120.0, gt=0.0, description="Seconds per judge request.")
    judge_concurrency: int = Field(8, ge=1, description="Judge requests in flight at once.")

    # -- infrastructure -----------------------------------------------------------
    database_url: str = Field(
        "sqlite:///speceyes.db", description="SQLAlchemy URL of the job store."
    )
    broker_url: str | None = Field(
        None, description="Redis URL of the Celery broker; unset means embedded mode."
    )
    broker_key_prefix: str = Field(
        "", description="Prefix of every Redis key the broker uses (isolates deployments)."
    )
    fast_queue: str = Field("speceyes.fast", description="Queue of phases I-III (batched).")
    slow_queue: str = Field("speceyes.slow", description="Queue of agent trajectories.")
    visibility_timeout_s: float = Field(
        3600.0,
        gt=0.0,
        description="A message taken by a worker that dies comes back after this many "
        "seconds. Must exceed the longest fast batch (with its wait) and the longest "
        "trajectory, or a live job is handed out twice (harmless, but wasted work).",
    )
    max_attempts: int = Field(
        3, ge=1, description="Tries per job and stage before it is failed with its reason."
    )
    retry_delay_s: float = Field(
        2.0,
        ge=0.0,
        description="Wait before a job is tried again; doubles with each retry of an outage "
        "(up to retry_max_delay_s), with jitter.",
    )
    retry_max_delay_s: float = Field(60.0, ge=0.0, description="The longest wait of a retry.")
    heartbeat_s: float = Field(5.0, gt=0.0, description="A worker's heartbeat interval.")
    worker_dead_after_s: float = Field(
        30.0,
        gt=0.0,
        description="A worker whose heartbeat is older than this is dead: the reconciler "
        "hands its running jobs to others (long before the visibility timeout).",
    )
    reconcile_interval_s: float = Field(
        10.0, gt=0.0, description="How often the reconciler (one worker at a time) sweeps."
    )
    reconcile_after_s: float = Field(
        30.0,
        gt=0.0,
        description="A waiting job with no message on the broker for this long is sent "
        "again (messages lost with a Redis restart, an enqueue that failed).",
    )
    worker_stall_exit_s: float = Field(
        120.0,
        gt=0.0,
        description="A worker that has taken nothing for this long while its queue holds "
        "messages exits non-zero, for its supervisor to restart it.",
    )

    # -- the HTTP API ---------------------------------------------------------------
    api_host: str = Field("127.0.0.1", description="Address `speceyes serve` listens on.")
    api_port: int = Field(8000, ge=1, le=65535, description="Port of `speceyes serve`.")
    api_require_keys: bool = Field(
        True, description="Every /v1 route needs a key (`speceyes keys create NAME`)."
    )
    upload_dir: Path = Field(
        Path("~/.cache/speceyes/uploads"),
        description="Where uploaded images are kept (by content hash); workers must read "
        "the same folder.",
    )
    image_roots: list[Path] = Field(
        default_factory=list,
        description="Folders whose files jobs may name by server-side path (JSON list); "
        "empty: no server-side paths.",
    )
    max_upload_bytes: int = Field(20 * 1024 * 1024, ge=1, description="Largest image upload.")
    max_request_bytes: int = Field(
        256 * 1024 * 1024, ge=1, description="Largest request body (a batch with images)."
    )
    max_question_chars: int = Field(2000, ge=1, description="Longest question (API and CLI).")
    max_options: int = Field(
        26, ge=2, le=26, description="Most multiple-choice options (the letters run A-Z)."
    )
    max_option_chars: int = Field(1000, ge=1, description="Longest multiple-choice option.")
    max_id_chars: int = Field(
        1000, ge=1, description="Longest row id, image path or known answer in a job."
    )
    max_batch_jobs: int = Field(10_000, ge=1, description="Most jobs in one batch request.")
    api_rate_per_s: float = Field(
        50.0, gt=0.0, description="Requests a second per API key (then 429 with Retry-After)."
    )
    api_rate_burst: int = Field(100, ge=1, description="Requests a key may make at once.")
    api_max_jobs_in_flight: int = Field(
        100_000,
        ge=1,
        description="Unfinished jobs (queued, deferred, running) per tenant; a submission "
        "beyond it answers 429.",
    )
    api_auth_failures_per_min: int = Field(
        30,
        ge=1,
        description="Failed authentications per client address a minute; more answer 429.",
    )
    api_decode_pixels: int = Field(
        100_000_000,
        ge=1,
        description="Pixels the API decodes at once to validate uploads (3-4 bytes each); "
        "more wait their turn. An image over it alone is decoded alone.",
    )

    @model_validator(mode="after")
    def _agent_defaults(self) -> Settings:
        """Thyme's reference values where the operator set none."""
        if self.agent == "thyme":
            for name, value in THYME_DEFAULTS.items():
                if name not in self.model_fields_set:
                    object.__setattr__(self, name, value)
        return self

    @field_validator("cache_dir", "upload_dir")
    @classmethod
    def _expand_dir(cls, value: Path) -> Path:
        return value.expanduser()

    @property
    def gate(self) -> GateSettings:
        return GateSettings(self.gate_mode, self.gate_top_k, self.gate_threshold)

    @property
    def image_limits(self) -> ImageLimits:
        return ImageLimits(max_bytes=self.max_image_bytes, max_pixels=self.max_image_pixels)

    @property
    def request_limits(self) -> RequestLimits:
        named = {f.name: getattr(self, f.name) for f in fields(RequestLimits) if f.init}
        return RequestLimits(**named)

    @property
    def agent_limits(self) -> AgentLimits:
        sandbox = SandboxLimits(
            wall_s=self.sandbox_wall_s,
            cpu_s=self.sandbox_cpu_s,
            memory_mb=self.sandbox_memory_mb,
            disk_mb=self.sandbox_disk_mb,
            files=self.sandbox_files,
            output_bytes=self.sandbox_output_bytes,
            text_chars=self.sandbox_text_chars,
            images=self.sandbox_max_images,
            image_pixels=self.sandbox_image_pixels,
        )
        return AgentLimits(
            max_steps=self.agent_max_steps,
            max_new_tokens=self.agent_max_new_tokens,
            min_box_side=self.min_box_side,
            max_box_aspect=self.max_box_aspect,
            sandbox=sandbox,
            isolation="none" if self.allow_unsandboxed_code else self.sandbox_isolation,
            bwrap=self.sandbox_bwrap,
            runsc=self.sandbox_runsc,
            sandbox_uid=self.sandbox_uid,
        )

    @property
    def funnel(self) -> FunnelSettings:
        # every field but the gate has the same name here
        named = {f.name: getattr(self, f.name) for f in fields(FunnelSettings)}
        return FunnelSettings(**named)


# the reference's values for Thyme (eval_code_thyme: SpecEyes.py --score_threshold,
# utils.py MAX_ITERATIONS and MAX_NEW_TOKENS_PER_STEP)
THYME_DEFAULTS: dict[str, Any] = {
    "gate_threshold": 0.95,
    "agent_max_steps": 5,
    "agent_max_new_tokens": 2048,
}


# -- what each part needs, built from Settings -------------------------------------------
# Small frozen views for the code that runs a stage (and for tests that build one by
# hand). Their defaults are read from Settings' fields, so each is written once, above.
def _default(name: str) -> Any:
    return Settings.model_fields[name].default


@dataclass(frozen=True)
class GateSettings:
    """What phase III needs; stored with every gated job."""

    mode: GateMode = _default("gate_mode")  # noqa: RUF009 -- a str, read once
    top_k: int = _default("gate_top_k")
    threshold: float = _default("gate_threshold")


@dataclass(frozen=True)
class ImageLimits:
    """Limits checked before an image is decoded (decompression bombs) and after."""

    max_bytes: int = _default("max_image_bytes")
    max_pixels: int = _default("max_image_pixels")
    max_aspect_ratio: float = 200.0  # Qwen's smart resize refuses anything wider


@dataclass(frozen=True)
class SandboxLimits:
    """What one execution of model-written code may spend (``common.sandbox``)."""

    wall_s: float = _default("sandbox_wall_s")
    cpu_s: int = _default("sandbox_cpu_s")
    memory_mb: int = _default("sandbox_memory_mb")  # all its processes and files
    disk_mb: int = _default("sandbox_disk_mb")
    files: int = _default("sandbox_files")
    open_files: int = 64
    file_mb: int = 64  # the largest file it may write
    threads: int = 32  # tasks (new processes are refused by seccomp in any case)
    output_bytes: int = _default("sandbox_output_bytes")  # the report; stderr likewise
    text_chars: int = _default("sandbox_text_chars")  # printed text handed to the model
    images: int = _default("sandbox_max_images")
    image_pixels: int = _default("sandbox_image_pixels")


@dataclass(frozen=True)
class RequestLimits:
    """What one request's texts may hold (``common.limits`` checks them)."""

    max_question_chars: int = _default("max_question_chars")
    max_options: int = _default("max_options")
    max_option_chars: int = _default("max_option_chars")
    max_id_chars: int = _default("max_id_chars")
    max_name_chars: int = dataclass_field(default=200, init=False)  # batches.name's width


@dataclass(frozen=True)
class AgentLimits:
    """What one trajectory may spend, which zoom boxes it refuses, where code runs."""

    max_steps: int = _default("agent_max_steps")
    max_new_tokens: int = _default("agent_max_new_tokens")
    min_box_side: int | None = _default("min_box_side")  # None: the protocol's
    max_box_aspect: float | None = _default("max_box_aspect")
    sandbox: SandboxLimits = dataclass_field(default_factory=SandboxLimits)
    isolation: Literal["bubblewrap", "gvisor", "none"] = _default("sandbox_isolation")
    bwrap: str = _default("sandbox_bwrap")
    runsc: str = _default("sandbox_runsc")
    sandbox_uid: int = _default("sandbox_uid")


@dataclass(frozen=True)
class FunnelSettings:
    """What the fast stage (phases I-III) needs."""

    gate: GateSettings = dataclass_field(default_factory=GateSettings)
    screener: Screener = _default("screener")  # noqa: RUF009 -- a str, read once
    baseline: bool = _default("baseline")
    calibrate: bool = _default("calibrate")
    screen_max_new_tokens: int = _default("screen_max_new_tokens")
    speculate_max_new_tokens: int = _default("speculate_max_new_tokens")
