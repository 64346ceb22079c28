"""Model specs -> something ``from_pretrained`` can load.

A spec is ``tiny`` (the random-weight checkpoints built offline, see ``tiny.py``),
``synth`` (tiny checkpoints trained on the SpecEyes-Synth world, shipped with the code),
a local checkpoint folder, or a Hugging Face hub id (downloaded into the hub cache on
first use, where a network is reachable).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from common.errors import ConfigurationError
from common.models.tiny import ensure_tiny

Role = Literal["small", "large"]

# Trained by `speceyes models train-synth --out common/models/weights/synth`.
SYNTH_WEIGHTS = Path(__file__).resolve().parent / "weights" / "synth"


def resolve_model(spec: str, role: Role, cache_dir: Path) -> str:
    """The path or hub id to load for ``spec`` in the given role."""
    if spec == "tiny":
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
