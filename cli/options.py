"""Flags shared by several commands, and how they become one ``Settings``.

A flag left out leaves the setting to the environment (``SPECEYES_*``) or its default.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from common.config import Settings
from common.errors import ConfigurationError

# flag dest -> Settings field
_FLAG_FIELDS = {
    "small": "small_model",
    "large": "large_model",
    "backend": "backend",
    "device": "device",
    "dtype": "dtype",
    "mode": "gate_mode",
    "top_k": "gate_top_k",
    "threshold": "gate_threshold",
    "screener": "screener",
    "baseline": "baseline",
    "calibrate": "calibrate",
    "batch_size": "fast_batch_size",
    "max_steps": "agent_max_steps",
    "agent": "agent",
    "protocol": "protocol",
    "agent_workers": "agent_workers",
    "db": "database_url",
    "broker": "broker_url",
    "judge_url": "judge_url",
    "judge_model": "judge_model",
    "audit_rate": "audit_rate",
    "audit_on_drift": "audit_on_drift",
}


def default(field: str) -> Any:
    """A setting's default, for help texts (each default is written once, in Settings)."""
    return Settings.model_fields[field].default


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("models")
    group.add_argument(
        "--small",
        metavar="MODEL",
        help="small model M_S: HF id, local folder, 'synth' or 'tiny' "
        f"(default {default('small_model')})",
    )
    group.add_argument(
        "--large",
        metavar="MODEL",
        help="agentic model M_L: HF id, local folder, 'synth' or 'tiny' "
        f"(default {default('large_model')})",
    )
    group.add_argument(
        "--agent",
        choices=["deepeyes", "thyme"],
        help="the large model's agent: 'deepeyes' (zoom tool calls, default) or 'thyme' "
        "(writes Python, run in the bubblewrap sandbox; tau 0.95, 5 steps of 2048 tokens)",
    )
    group.add_argument(
        "--backend",
        choices=["transformers", "scripted", "openai"],
        help="model backend: in-process transformers, scripted (tests), or openai (models "
        "behind an OpenAI-compatible server: SPECEYES_LARGE_SERVER_URL, ...)",
    )
    group.add_argument("--device", help="'auto', 'cpu', 'cuda', 'cuda:1', ...")
    group.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    group.add_argument(
        "--protocol",
        choices=["auto", "reference", "v0"],
        help="what the models are shown: 'reference' (the SpecEyes evaluation), 'v0' (our "
        "first wording, the synth models'); 'auto' (default): what a checkpoint declares, "
        "else reference",
    )


def add_funnel_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("funnel")
    group.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="the gate from a calibration file (speceyes calibrate --out): mode, K, tau",
    )
    group.add_argument(
        "--mode",
        choices=["min", "mean", "bottom20", "logprob"],
        help=f"gate aggregation (default {default('gate_mode')})",
    )
    group.add_argument(
        "--top-k",
        type=int,
        metavar="K",
        help=f"logits per token for the gate (default {default('gate_top_k')})",
    )
    group.add_argument(
        "--threshold",
        type=float,
        metavar="TAU",
        help=f"accept iff confidence > TAU (default {default('gate_threshold')})",
    )
    group.add_argument(
        "--screener",
        choices=["large", "small", "none"],
        help=f"who screens in phase I (default {default('screener')})",
    )
    group.add_argument(
        "--baseline",
        action="store_true",
        default=None,
        help="no speculation: every job runs the agent",
    )
    group.add_argument(
        "--calibrate",
        action="store_true",
        default=None,
        help="a calibration run: every job is speculated (top 128 logits kept) AND runs the "
        "agent, so `speceyes calibrate` can replay any gate without a model",
    )
    group.add_argument(
        "--audit-rate",
        type=float,
        metavar="SHARE",
        help=f"share of accepted answers also run through the agent (default "
        f"{default('audit_rate')}; 0: none)",
    )
    group.add_argument(
        "--on-drift",
        choices=["warn", "raise-tau", "pause"],
        dest="audit_on_drift",
        help="when the audit's agreement falls below the calibration's (or the floor): "
        "warn (default), raise tau to the calibration's next step, or pause accepting",
    )
    group.add_argument(
        "--max-steps",
        type=int,
        metavar="N",
        help=f"agent generations per job (default {default('agent_max_steps')})",
    )


def add_store_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        help=f"job store: sqlite:///file.db (default {default('database_url')}) or "
        "postgresql://user@host/db",
    )


def add_broker_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        metavar="URL",
        help="Redis URL of the distributed pipeline, e.g. redis://127.0.0.1:6379/0 "
        "(default: SPECEYES_BROKER_URL; unset means embedded)",
    )


def add_pipeline_flags(parser: argparse.ArgumentParser) -> None:
    """Everything a command that runs or serves the pipeline takes: models, funnel, store,
    broker."""
    add_model_flags(parser)
    add_funnel_flags(parser)
    add_store_flags(parser)
    add_broker_flags(parser)


def _calibrated_gate(path: Path) -> dict[str, Any]:
    """The gate settings a calibration file names."""
    try:
        record = json.loads(path.read_text())
        gate = record["gate"]
        values: dict[str, Any] = {
            "gate_mode": gate["mode"],
            "gate_top_k": int(gate["top_k"]),
            "gate_threshold": float(gate["threshold"]),
        }
        if record.get("accepted"):  # what the audit compares with
            values["audit_baseline"] = 1 - record["wrong"] / record["accepted"]
        values["audit_tau_steps"] = [float(tau) for tau in record.get("stricter", [])]
        return values
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"{path}: not a calibration file ({exc})") from None


def settings_from_args(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Settings from the flags that were given (a gate flag beats a --calibration file's),
    the environment, then the defaults."""
    calibration = getattr(args, "calibration", None)
    values = _calibrated_gate(calibration) if calibration is not None else {}
    values.update(
        (field, getattr(args, flag))
        for flag, field in _FLAG_FIELDS.items()
        if getattr(args, flag, None) is not None
    )
    values.update(overrides)
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise ConfigurationError(problems) from None
