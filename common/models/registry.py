"""Model specs -> something ``from_pretrained`` can load.

A spec is ``tiny`` (the random-weight checkpoints built offline, see ``tiny.py``),
``synth`` (tiny checkpoints trained on the SpecEyes-Synth world, shipped with the code),
a local checkpoint folder, or a Hugging Face hub id (downloaded into the hub cache on
first use, where a network is reachable).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from huggingface_hub import HfApi, constants, try_to_load_from_cache
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

from common.errors import ConfigurationError

Role = Literal["small", "large"]

# Trained by `speceyes models train-synth --out common/models/weights/synth`.
SYNTH_WEIGHTS = Path(__file__).resolve().parent / "weights" / "synth"


def resolve_model(spec: str, role: Role, cache_dir: Path) -> str:
    """The path or hub id to load for ``spec`` in the given role."""
    if spec == "tiny":
        # (here, not at the top: building them needs torch; naming a model does not, and
        # a corpus is submitted without torch in memory)
        from common.models.tiny import ensure_tiny

        return str(ensure_tiny(cache_dir)[role])
    if spec == "synth":
        if not (SYNTH_WEIGHTS / role / "model.safetensors").is_file():
            raise ConfigurationError(
                f"the synth weights are missing from {SYNTH_WEIGHTS}; train them with "
                "`speceyes models train-synth --out common/models/weights/synth`"
            )
        return str(SYNTH_WEIGHTS / role)
    local = Path(spec).expanduser()
    if local.exists():
        return str(local)
    if spec.startswith(("/", ".", "~")) or spec.count("/") > 1:
        raise ConfigurationError(f"model {spec!r}: no checkpoint folder at {local}")
    return spec


# How long the check waits for the hub before saying it cannot be reached.
HUB_PROBE_S = 5.0

OFFLINE_HINT = (
    "Without a hub: --small synth --large synth --threshold 0.9 (the trained tiny models "
    "shipped here, at their own scale: docs/synth.md), "
    "tiny (random weights), or a checkpoint folder (--large /models/DeepEyes-7B)"
)


def check_available(spec: str, role: Role, cache_dir: Path) -> str:
    """``resolve_model``, and for a hub id, that it can be had: it is in the local hub
    cache, or the hub answers for it. Seconds, not the minutes a load would take to
    fail, so a command can refuse before it creates any work."""
    path = resolve_model(spec, role, cache_dir)
    if path != spec or Path(spec).expanduser().exists():
        return path  # a local folder (tiny and synth resolve to theirs)
    if isinstance(try_to_load_from_cache(spec, "config.json"), str):
        return path
    where = f"model {spec!r} ({role}) is neither a local folder nor in the Hugging Face cache"
    if constants.HF_HUB_OFFLINE:
        raise ConfigurationError(f"{where}, and HF_HUB_OFFLINE is set. {OFFLINE_HINT}")
    try:
        HfApi().model_info(spec, timeout=HUB_PROBE_S)
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ConfigurationError(
            f"{where}, and the hub has no model {spec!r} this machine may download "
            f"({type(exc).__name__}). {OFFLINE_HINT}"
        ) from None
    except Exception as exc:  # any failure to reach the hub says the same
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigurationError(
            f"{where}, and the hub cannot be reached ({reason}). {OFFLINE_HINT}"
        ) from None
    return path


def declared_protocol(spec: str, role: Role) -> str | None:
    """The protocol a local checkpoint says it was trained with (``speceyes.json`` in its
    folder: ``{"protocol": "v0"}``), or None."""
    folder = _local_folder(spec, role)
    marker = folder / "speceyes.json" if folder is not None else None
    if marker is None or not marker.is_file():
        return None
    try:
        name = json.loads(marker.read_text())["protocol"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"{marker}: not a protocol declaration ({exc})") from None
    return str(name)


def protocol_name(spec: str, role: Role, setting: str, agent: str = "deepeyes") -> str:
    """The protocol to serve ``spec`` with: the one it declares, else the setting's
    (``auto``: ``reference``). ``reference`` means the SpecEyes evaluation of the agent in
    use: ``thyme`` when the agent is Thyme. A model is never served with a protocol it
    was not trained with: a setting that contradicts its declaration is an error."""
    declared = declared_protocol(spec, role)
    wanted = "reference" if setting == "auto" else setting
    if agent == "thyme":
        if (declared or wanted) not in ("reference", "thyme"):
            raise ConfigurationError(
                f"--agent thyme needs the reference protocol (Thyme's evaluation), but "
                f"model {spec!r} ({role}) is served with {declared or wanted!r}"
            )
        return "thyme"
    if declared is None:
        return wanted
    if setting not in ("auto", declared):
        raise ConfigurationError(
            f"model {spec!r} ({role}) was trained with the {declared!r} protocol; serving "
            f"it with {setting!r} would show it prompts it never saw (use --protocol auto "
            f"or {declared})"
        )
    return declared


def _local_folder(spec: str, role: Role) -> Path | None:
    if spec == "synth":
        return SYNTH_WEIGHTS / role
    if spec == "tiny":
        return None
    folder = Path(spec).expanduser()
    return folder if folder.is_dir() else None


def weights_fingerprint(spec: str, role: Role) -> str | None:
    """A digest of the checkpoint a local spec (``synth`` or a folder) names, so that a key
    built from it changes when the weights do: a re-trained ``synth`` must not find the
    answers of the old one. ``tiny`` is built from code (its spec says it all) and a hub
    id names its own weights: both give None.

    Every JSON file is read whole (configs, tokenizer); a weight file by its size and
    first and last MiB, so a multi-GB checkpoint costs two reads, not a full pass."""
    if spec == "tiny":
        return None
    folder = SYNTH_WEIGHTS / role if spec == "synth" else Path(spec).expanduser()
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        digest.update(str(path.relative_to(folder)).encode())
        if path.suffix == ".json":
            digest.update(path.read_bytes())
        elif path.suffix in {".safetensors", ".bin", ".pt", ".pth"}:
            size = path.stat().st_size
            digest.update(str(size).encode())
            with path.open("rb") as weights:
                digest.update(weights.read(1 << 20))
                weights.seek(max(0, size - (1 << 20)))
                digest.update(weights.read(1 << 20))
    return digest.hexdigest()[:16]
