"""Model specs -> something ``from_pretrained`` can load.

A spec is ``tiny`` (the random-weight checkpoints built offline, see ``tiny.py``),
``synth`` (tiny checkpoints trained on the SpecEyes-Synth world, shipped with the code),
a local checkpoint folder, or a Hugging Face hub id (downloaded into the hub cache on
first use, where a network is reachable).
"""

from __future__ import annotations

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
