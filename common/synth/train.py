"""Teaching the tiny models the SpecEyes task in the synth world, on a CPU, in minutes.

Both models start from the tiny random-weight checkpoints and learn by teacher forcing,
with the loss on the final assistant turn only, through the SAME prompts, chat template,
processor and zoom mechanics that serve them:

- the small model (Qwen3-VL) answers directly, with the phase-II prompt;
- the agent model (Qwen2.5-VL) learns the phase-I screen ("yes" for small targets, "no"
  for large ones) and DeepEyes trajectories with the real DeepEyes prompts: a direct
  answer when the target is large; otherwise a zoom into the target's grid cell (in its
  view's pixels), then the answer from the crop.

Only the positions that predict target tokens go through the output layer (cheaper than
``labels=``, which projects every position onto the vocabulary).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from common.agents.deepeyes import (
    INSTRUCTION_SUFFIX,
    SYSTEM_PROMPT,
    TOOL_NAME,
    AgentLimits,
    map_box,
)
from common.backends.base import Message
from common.backends.transformers_backend import load_processor, template_messages
from common.images import ResizeRule
from common.prompts import format_question, screen_text, speculate_text
from common.synth.world import SIZE, SMALL_VIEW, SynthItem, items, make_item


@dataclass(frozen=True)
class Example:
    """A conversation whose last (assistant) message is the target.

    ``kind`` says which step it teaches (screen, direct answer, zoom, read after the
    zoom), so training can draw some kinds more often than others.
    """

    messages: list[Message]
    kind: str = "answer"


# How often each kind of agent example is drawn in the main stage. The screen is learned
# in minutes and where targets are in the curriculum before; what stays slow is the
# yes / no comparison, in the direct answer and in the answer after the crop.
AGENT_WEIGHTS = {"screen": 0.1, "direct": 0.3, "zoom": 0.25, "read": 0.35}

# Where a target is must be learned on large targets first: from scratch, a 6-8 px target
# in the agent's 224 px view gives no signal to follow (the zoom box stayed at chance
# after 4 minutes), while a large one is located within ~3 minutes, and the skill carries
# down as the targets shrink. (target side in px, minutes of zoom-only training)
LOCALISATION_CURRICULUM = (((128, 208), 3.0), ((64, 128), 1.5), ((40, 64), 1.5))


# The small model at its 128 px view is unstable at 2e-3: of three 4-6 minute runs one
# learned (easy 99%), one half did (easy 89%), one stayed at chance; at 1e-3 easy items
# were 100% right after 4 minutes.
LEARNING_RATES = {"small": 1e-3, "large": 2e-3}


@dataclass
class Views:
    """An item's images as each model's processor would see them, made once."""

    small: Image.Image  # the whole image at the small model's view
    agent: Image.Image  # the whole image at the agent's view
    crop: Image.Image  # the zoom cell, cropped from the original, at the agent's view


# Yes / no needs the asked colour next to the seen one, and a 2-layer model copies a word
# reliably only from ~60-80 positions back (the slowest rope pair must barely turn over
# the distance). So the trajectory carries the asked colour forward in short hops: the
# question -> the first thought -> the zoom's label (the object looked for, as DeepEyes
# labels it) -> the thought after the crop; each hop is <= ~80 positions. Copied straight
# from the question, ~190 positions back after a zoom, it was wrong 17 times in 48.
def _asked(item: SynthItem) -> str:
    """How a thought starts: with the colour a yes / no question asks about."""
    return f"asked {item.asked}, " if item.asked else ""


def zoom_call(item: SynthItem, view_box: Sequence[int]) -> str:
    thought = f"{_asked(item)}too small, zoom in"
    label = f"{item.asked} {item.shape}" if item.asked else item.shape
    call = {"name": TOOL_NAME, "arguments": {"bbox_2d": list(view_box), "label": label}}
    return f"<think>{thought}</think> <tool_call>{json.dumps(call)}</tool_call>"


def answer_text(item: SynthItem) -> str:
    """The final turn: a thought that names what is seen (and, for yes / no, what was
    asked), then the answer. Without it the tiny agent answered yes / no at chance: one
    answer token had to read the colour from the image AND compare it with a word far
    back; with it, the answer compares two words just written."""
    return f"<think>{_asked(item)}I see {item.colour}</think> <answer>{item.answer}</answer>"


def small_example(item: SynthItem, views: Views) -> Example:
    prompt = speculate_text(item.question, item.options)
    return Example([Message("user", [views.small, prompt]), Message("assistant", [item.answer])])


def agent_examples(item: SynthItem, views: Views, rule: ResizeRule) -> list[Example]:
    """The screen, and every step of the item's trajectory."""
    hard = item.difficulty == "hard"
    screen = Example(
        [
            Message("user", [views.agent, screen_text(item.question, item.options)]),
            Message("assistant", ["yes" if hard else "no"]),
        ],
        "screen",
    )
    opening = [
        Message("system", [SYSTEM_PROMPT]),
        Message(
            "user",
            [views.agent, f"\n{format_question(item.question, item.options)}{INSTRUCTION_SUFFIX}"],
        ),
    ]
    if not hard:
        direct = Example([*opening, Message("assistant", [answer_text(item)])], "direct")
        return [screen, direct]
    call = zoom_call(item, item.view_box(rule.size_for(SIZE, SIZE)[0]))
    observation = Message(
        "user", ["<tool_response>", views.crop, INSTRUCTION_SUFFIX, "</tool_response>"]
    )
    zoom = Example([*opening, Message("assistant", [call])], "zoom")
    after_zoom = [Message("assistant", [call]), observation]
    read = Example([*opening, *after_zoom, Message("assistant", [answer_text(item)])], "read")
    return [screen, zoom, read]


def make_views(item: SynthItem, small_rule: ResizeRule, agent_rule: ResizeRule) -> Views:
    original = item.render()
    crop_box = map_box(
        [float(v) for v in item.view_box(agent_rule.size_for(*original.size)[0])],
        original.size,
        agent_rule,
        AgentLimits(),
    )
    return Views(
        small=small_rule.apply(original),
        agent=agent_rule.apply(original),
        crop=agent_rule.apply(original.crop(crop_box)),
    )


class Batcher:
    """Turns examples into model inputs plus the positions and ids of target tokens."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.processor.tokenizer.padding_side = "left"

    def __call__(
        self, examples: Sequence[Example]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        texts, images, target_lengths = [], [], []
        for example in examples:
            messages, example_images = template_messages(example.messages)
            images.extend(example_images)
            texts.append(self.processor.apply_chat_template(messages, tokenize=False))
            # The target follows "assistant\n": its tokens do not merge with what precedes.
            target = "".join(str(part) for part in example.messages[-1].content)
            target_lengths.append(len(self.processor.tokenizer.encode(target)) + 1)  # + <|im_end|>
        inputs = self.processor(text=texts, images=images, padding=True, return_tensors="pt")
        end = inputs["input_ids"].shape[1] - 1  # the newline after <|im_end|> is no target
        rows = [row for row, n in enumerate(target_lengths) for _ in range(n)]
        cols = [col for n in target_lengths for col in range(end - n, end)]
        positions = torch.tensor([rows, cols])
        targets = inputs["input_ids"][positions[0], positions[1]]
        return dict(inputs), positions, targets


def target_loss(
    model: Any, inputs: dict[str, torch.Tensor], positions: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """Cross-entropy of the target tokens; logits only where they are predicted."""
    hidden = model.model(**inputs).last_hidden_state  # [B, T, H]
    predicting = hidden[positions[0], positions[1] - 1]  # position t-1 predicts token t
    logits = model.lm_head(predicting)
    loss = torch.nn.functional.cross_entropy(logits, targets)
    accuracy = (logits.argmax(-1) == targets).float().mean().item()
    return loss, accuracy


@dataclass
class TrainReport:
    steps: int
    seconds: float
    loss: float
    token_accuracy: float


def train(
    checkpoint: Path,
    make_examples: Callable[[SynthItem, Views], list[Example]],
    pool: Sequence[tuple[SynthItem, Views]],
    *,
    minutes: float,
    weights: dict[str, float] | None = None,
    batch_size: int = 16,
    lr: float = 2e-3,
    seed: int = 0,
    on_log: Callable[[str], None] = print,
) -> TrainReport:
    """Train the checkpoint in place for ``minutes`` of wall time, then save it.

    Batches mix kinds of example, each kind drawn as often as ``weights`` says (single
    -kind batches were tried: the model stopped looking at the image). The learning rate
    warms up, then follows a cosine over the time budget down to a tenth.
    """
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32)
    model.train()
    # The patch embedding stays at its random init: a random projection of pixel patches
    # keeps their colour, and its backward pass is the single most expensive op here.
    model.model.visual.patch_embed.requires_grad_(False)
    batcher = Batcher(load_processor(str(checkpoint)))
    examples = [example for item, views in pool for example in make_examples(item, views)]
    per_kind = Counter(example.kind for example in examples)
    draw = [(weights or {}).get(e.kind, 1.0) / per_kind[e.kind] for e in examples]
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    warmup, budget = 50, minutes * 60
    started, step, smoothed, accuracy = time.monotonic(), 0, 0.0, 0.0
    while (elapsed := time.monotonic() - started) < budget:
        batch = rng.choices(examples, draw, k=batch_size)
        inputs, positions, targets = batcher(batch)
        loss, accuracy_now = target_loss(model, inputs, positions, targets)
        decay = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * elapsed / budget))
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup) * decay
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        step += 1
        smoothed = loss.item() if step == 1 else 0.95 * smoothed + 0.05 * loss.item()
        accuracy = accuracy_now if step == 1 else 0.95 * accuracy + 0.05 * accuracy_now
        if step % 50 == 0:
            on_log(
                f"  step {step:5d}  {time.monotonic() - started:6.0f} s  "
                f"loss {smoothed:.4f}  token acc {accuracy:.3f}"
            )
    model.eval()
    model.save_pretrained(checkpoint)
    for path in checkpoint.iterdir():
        path.chmod(0o644)
    return TrainReport(step, time.monotonic() - started, smoothed, accuracy)


def curriculum_items(count: int, seed: int, sizes: tuple[int, int]) -> list[SynthItem]:
    """Items like hard ones (a zoom is due) but with targets of ``sizes``."""
    rng = random.Random(seed)
    return [make_item(rng.getrandbits(48), difficulty="hard", sizes=sizes) for _ in range(count)]


def build_pool(
    count: int, seed: int, small_rule: ResizeRule, agent_rule: ResizeRule
) -> list[tuple[SynthItem, Views]]:
    return [(item, make_views(item, small_rule, agent_rule)) for item in items(count, seed)]


def copy_checkpoint(source: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)


def train_synth(
    out: Path,
    *,
    items_count: int = 1500,
    seed: int = 0,
    small_minutes: float = 4.0,
    large_minutes: float = 23.0,
    on_log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train both synth models from the tiny random checkpoints into ``out/{small,large}``."""
    import tempfile

    from common.models.tiny import build_tiny

    with tempfile.TemporaryDirectory() as scratch:
        random_models = build_tiny(Path(scratch) / "tiny")
        for role in ("small", "large"):
            copy_checkpoint(random_models[role], out / role)
    set_view(out / "small", SMALL_VIEW)
    rules = {role: rule_of(out / role) for role in ("small", "large")}
    started = time.monotonic()
    pool = build_pool(items_count, seed, rules["small"], rules["large"])
    on_log(f"rendered {len(pool)} training items in {time.monotonic() - started:.0f} s")
    reports = {}
    curriculum_minutes = sum(minutes for _, minutes in LOCALISATION_CURRICULUM)
    for step, (sizes, minutes) in enumerate(LOCALISATION_CURRICULUM):
        on_log(f"agent, locating targets of {sizes[0]}-{sizes[1]} px for {minutes:g} min")
        locate = [
            (item, make_views(item, rules["small"], rules["large"]))
            for item in curriculum_items(400, seed + 1 + step, sizes)
        ]
        reports[f"locate-{sizes[0]}-{sizes[1]}"] = train(
            out / "large",
            lambda item, views: agent_examples(item, views, rules["large"])[1:2],  # the zoom
            locate,
            minutes=minutes,
            seed=seed + 1 + step,
            on_log=on_log,
        )
    budgets = (("small", small_minutes), ("large", max(1.0, large_minutes - curriculum_minutes)))
    for role, minutes in budgets:
        on_log(f"training the {role} model for {minutes:g} min")
        make: Callable[[SynthItem, Views], list[Example]] = (
            (lambda item, views: [small_example(item, views)])
            if role == "small"
            else (lambda item, views: agent_examples(item, views, rules["large"]))
        )
        weights = AGENT_WEIGHTS if role == "large" else None
        reports[role] = train(
            out / role,
            make,
            pool,
            minutes=minutes,
            weights=weights,
            lr=LEARNING_RATES[role],
            seed=seed,
            on_log=on_log,
        )
    info = {
        "items": items_count,
        "seed": seed,
        "world": "speceyes-synth-v1",
        "small_view": SMALL_VIEW,
        "learning_rates": LEARNING_RATES,
        "agent_curriculum": [[*sizes, minutes] for sizes, minutes in LOCALISATION_CURRICULUM],
        **{role: report.__dict__ for role, report in reports.items()},
    }
    (out / "synth-info.json").write_text(json.dumps(info, indent=2))
    return info


def set_view(checkpoint: Path, side: int) -> None:
    """Cap the checkpoint's image processor at ``side`` x ``side`` pixels: what the model
    sees is part of the model, so the serving code reads it from the checkpoint as well."""
    path = checkpoint / "preprocessor_config.json"
    config = json.loads(path.read_text())
    config["size"]["longest_edge"] = side * side
    path.write_text(json.dumps(config, indent=2) + "\n")


def rule_of(checkpoint: Path) -> ResizeRule:
    """How the checkpoint's image processor resizes an image (what its model sees)."""
    config = json.loads((checkpoint / "preprocessor_config.json").read_text())
    factor = config["patch_size"] * config["merge_size"]
    return ResizeRule(factor, config["size"]["shortest_edge"], config["size"]["longest_edge"])
