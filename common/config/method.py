"""The method's settings: phases I-III (the funnel, the gate), the online audit, the
LLM judge."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import SecretStr, model_validator

from common.config.base import DepthScope, GateMode, Group, Method, Screener, group, setting


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
        "(speceyes calibrate); at speculation depth D >= 1 every job also zooms, so "
        "any depth d <= D replays too (speceyes calibrate, speceyes report).",
        flag="--calibrate",
    )
    screen_max_new_tokens: int = setting(10, "New tokens of a phase-I answer (yes/no).", ge=1)
    speculate_max_new_tokens: int = setting(20, "New tokens of the small model's answer.", ge=1)
    speculation_depth: int = setting(
        0,
        "D: zooms the small model may make before it answers (the DeepEyes zoom tool, "
        "the agent's crop rules); 0: none, the paper's method exactly "
        "(docs/protocols.md, 'Speculation in depth').",
        flag="--speculation-depth",
        metavar="D",
        ge=0,
        le=4,
    )
    depth_scope: DepthScope = setting(
        "all",
        "At D >= 1, which jobs the small model may zoom for: 'all' (those the screen "
        "sent to the agent too: the ones a zoom helps) or 'tool_free' (those it let "
        "through, as at D = 0). Measured on SpecEyes-Synth, 'tool_free' only made the "
        "easy jobs dearer (docs/benchmarks.md, 'Speculation in depth').",
        flag="--depth-scope",
    )
    zoom_max_new_tokens: int = setting(
        256, "At D >= 1, new tokens of each of the small model's turns.", ge=16
    )
    fast_batch_size: int = setting(
        32, "Largest micro-batch of phases I-III.", flag="--batch-size", metavar="N", ge=1
    )
    fast_max_wait_s: float = setting(
        0.5, "Distributed fast pool: longest wait to fill a batch.", ge=0.0
    )
    fast_batch_pixels: int = setting(
        256_000_000,
        "Most image pixels a fast micro-batch decodes at once (3-4 bytes each); "
        "a batch of larger images runs in smaller groups. At speculation depth >= 1, "
        "also the most a round of zooms shows the small model in one call (each job's "
        "image and crops so far).",
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
        if self.speculation_depth and self.method == "specreason":
            raise ValueError(
                "speculation_depth >= 1 speculates in the funnel's phase II: method "
                "'specreason' runs no funnel"
            )
        return self


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
        "when the audits reject it (at audit.level).",
        gt=0.0,
        le=1.0,
    )
    level: float = setting(
        0.01,
        "The chance that a batch whose agreement holds at the expected one raises a "
        "false drift alarm, over all its audits (a sequential test, valid at every "
        "audit: common.pipeline.drift).",
        ge=1e-6,
        le=0.5,
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
