"""Teaching the tiny models the SpecEyes task in the synth world, on a CPU, in minutes.

Both models start from the tiny random-weight checkpoints and learn by teacher forcing,
with the loss on the final assistant turn only, through the SAME prompts, chat template,
processor and zoom mechanics that serve them:

- the small model (Qwen3-VL) answers directly, with the phase-II prompt;
- the agent model (Qwen2.5-VL) learns the phase-I screen ("yes" for small targets, "no"
  for large ones) and DeepEyes trajectories with the real DeepEyes prompts: a direct
  answer when the target is large; otherwise a zoom into the target's grid cell (in its
  view's pixels), then the answer from the crop.

Both also learn auxiliary steps that nothing serves: naming the shape of a colour ("Which
shape is red?") and, for the small model, which shape its question asks about. Picking
the shape the question names among two or three is the slow part of the world; these
steps give it more to learn from than colour answers alone.

Only the positions that predict target tokens go through the output layer (cheaper than
``labels=``, which projects every position onto the vocabulary).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from common.agents.deepeyes import TOOL_NAME, map_box
from common.backends.transformers_backend import load_processor, template_messages
from common.chat import Message
from common.config import AgentSettings
from common.images import ResizeRule
from common.models.tiny import build_tiny
from common.protocols import V0
from lab.synth.world import CELL, SIZE, SMALL_VIEW, SynthItem, items, make_item

# The wording the shipped synth models learned (and are served with: their speceyes.json).
PROTOCOL = V0


@dataclass(frozen=True)
class Example:
    """A conversation whose last (assistant) message is the target.

    ``kind`` says which step it teaches (screen, direct answer, zoom, read after the
    zoom), so training can draw some kinds more often than others.
    """

    messages: list[Message]
    kind: str = "answer"
    # When set, the target's first token is taught as an even share of these answers'
    # first tokens, not as the right one: what the model cannot see, it must not be sure
    # of (the small model on hard items, see small_example).
    unsure: tuple[str, ...] = ()
    unsure_after: str = ""  # the target's text before the token taught unsure ("": the first)


# How often each kind of agent example is drawn in the main stage. The screen is learned
# in minutes and where targets are in the curriculum before; what stays slow is picking
# the named shape among the others (the direct answer) and the yes / no comparison.
AGENT_WEIGHTS = {
    "screen": 0.1,
    "name": 0.1,
    "direct": 0.3,
    "zoom": 0.2,
    "read": 0.3,
}

# Where a target is must be learned on lone, large targets first: from scratch, a 6-8 px
# target in the agent's 224 px view gives no signal to follow (the zoom box stayed at
# chance after 4 minutes), while a large one is located within ~3 minutes, and the skill
# carries down as the targets shrink. (target side in px, minutes of zoom-only training)
LOCALISATION_CURRICULUM = (((128, 208), 3.0), ((64, 128), 1.5), ((40, 64), 1.5))

# The small model first learns colours and shape kinds on lone shapes (minutes), then the
# world. Picking the named shape among others stayed at chance (held-out easy items 26%
# right after 7 minutes of answers alone, the training loss falling only as the model
# memorised its items) until it also learned to name shapes ("Which shape is red?"):
# then 98% of easy multiple-choice items after 7.5 minutes, in that run (see TAKEOFF).
# Which shape its question asks about ("kind") is the other half of picking it. Hard
# items' answers are taught unsure (see small_example), at half the weight of easy ones:
# picking then took off after 2-4 minutes of the world in both runs (8-12 before), and
# held-out easy items were 100% right after 16 (with weight 0.5 the same, its sure
# answers a little less sure: mean separability 5.29 against 5.79).
SMALL_WARMUP_MINUTES = 1.5
SMALL_WEIGHTS = {"answer": 0.5, "unsure": 0.25, "name": 0.5, "kind": 0.25}

# The small model at its 128 px view is unstable at 2e-3: of three 4-6 minute runs on
# lone shapes one learned (easy 99%), one half did (easy 89%), one stayed at chance; at
# 1e-3 easy items were 100% right after 4 minutes. Among two or three shapes, at 1e-3 its
# answers sat at one per kind of question for 6-10 minutes in five runs of this world and
# its variants; at 5e-4 the same recipe took off after 8 minutes (easy items 94% / 97%
# after 16).
LEARNING_RATES = {"small": 5e-4, "large": 1e-3}

# Picking the shape the question names is learned in a jump, and when it comes depends on
# the seed: in one run the small model's held-out easy multiple-choice items went from
# chance to 98% within 7.5 minutes, in others they were still at chance after 25. A run
# that has not passed TAKEOFF's share after its minutes of the world starts over from the
# random checkpoint with another seed, while the budget leaves time for one more.
TAKEOFF = (10.0, 0.6)  # (minutes of the world, share of held-out easy choice items)

LAST_STAGE_MINUTES = 1.0  # the least the world stage gets when rendering ate the budget

# The small model's zooms (speculation in depth, common.pipeline.depth) are taught after
# the world, on top of what it learned there: the DeepEyes steps the agent learns, at the
# small model's own 128 px view and crops. First where lone targets are (zoom calls only,
# as the agent's curriculum), then the whole mix, its phase-II examples kept in it so that
# its depth-0 answers stay what they were. (target side in px, minutes)
#
# Measured (docs/synth.md, 2026-12-04): a 10-minute stage (lone 64-128 and 40-64 px for
# 1.5 minutes each, 6.3 of the world, no misread zooms) never found the target, its
# held-out zoom box at chance (2-8%) while every call parsed and crops were read 100%.
# The 16-minute stage that made the shipped weights found it after the curriculum (17%)
# and in the world (35 / 62 / 81 / 100% after 2 / 4 / 6 / 8 minutes); its 128-208 px
# stage ran only 86 steps on a shared machine, so what it adds is not measured. Its cost:
# depth-0 hard answers surer (separability AUC easy > hard 0.97, was 1.00), the "unsure"
# share of the mix below being 0.1 against the world stage's 0.25.
SMALL_ZOOM_CURRICULUM = LOCALISATION_CURRICULUM
SMALL_ZOOM_MINUTES = 16.0  # the stage's budget, its curriculum and rendering included
SMALL_ZOOM_HELD_OUT = 96  # items whose steps are probed as it learns
SMALL_ZOOM_WEIGHTS = {
    "answer": 0.25,
    "unsure": 0.1,
    "name": 0.1,
    "kind": 0.05,
    "direct": 0.15,
    "zoom": 0.15,
    "read": 0.1,
    "misread": 0.1,
}

# Training logs held-out progress this often (and at the end of each stage).
PROBE_SECONDS = 120.0
HELD_OUT_SEED = 1000  # + the training seed: items apart from training's and the report's


@dataclass
class Views:
    """An item's images as each model's processor would see them, made once."""

    small: Image.Image  # the whole image at the small model's view
    agent: Image.Image  # the whole image at the agent's view
    crop: Image.Image  # the zoom cell, cropped from the original, at the agent's view


# The trajectory's thoughts break each answer into steps a 2-layer model can take:
#
# - the answer thought names the target's kind, then its colour ("the square is
#   yellow"): the colour token is predicted right after the kind word, so attention can
#   look for that kind in the image (the image holds two or three shapes) and read it;
#   the answer then copies a word just written. Without a thought the tiny agent answered
#   yes / no at chance: one token had to read the colour AND compare it with a word far
#   back.
# - yes / no needs the asked colour next to the seen one, and this model copies a word
#   reliably only from ~60-80 positions back (the slowest rope pair must barely turn over
#   the distance). So the asked colour and kind are carried forward in short hops: the
#   question -> the first thought -> the zoom's label (the object looked for, as DeepEyes
#   labels it) -> the thought after the crop. Copied straight from the question, ~190
#   positions back after a zoom, the colour was wrong 17 times in 48.
def _asked(item: SynthItem) -> str:
    return f"asked {item.asked} {item.shape}, " if item.asked else ""


def zoom_call(item: SynthItem, view_box: Sequence[int]) -> str:
    thought = f"{_asked(item)}the {item.shape} is too small, zoom in"
    label = f"{item.asked} {item.shape}" if item.asked else item.shape
    call = {"name": TOOL_NAME, "arguments": {"bbox_2d": list(view_box), "label": label}}
    return f"<think>{thought}</think> <tool_call>{json.dumps(call)}</tool_call>"


def answer_text(item: SynthItem) -> str:
    """The final turn: a thought that names what was asked (yes / no) and what is seen,
    then the answer."""
    thought = f"{_asked(item)}the {item.shape} is {item.colour}"
    return f"<think>{thought}</think> <answer>{item.answer}</answer>"


def name_example(item: SynthItem, image: Image.Image) -> Example:
    """An auxiliary step that teaches what the shapes are: "Which shape is <colour>?"
    (training only; nothing serves it)."""
    question = PROTOCOL.speculate_text(f"Which shape is {item.colour}?", None)
    return Example([Message("user", [image, question]), Message("assistant", [item.shape])], "name")


def kind_example(item: SynthItem, image: Image.Image) -> Example:
    """An auxiliary step: the small model's own prompt for the item, then "Which shape does
    the question ask about?" (training only). Answering the real question takes two steps
    at once, bringing the asked kind to the answer and finding that kind in the image, and
    neither is learned while the other is missing; this step teaches the first alone."""
    prompt = (
        PROTOCOL.speculate_text(item.question, item.options)
        + "\nWhich shape does the question ask about?"
    )
    return Example([Message("user", [image, prompt]), Message("assistant", [item.shape])], "kind")


def small_example(item: SynthItem, image: Image.Image, *, unsure: bool = False) -> Example:
    """The question with the phase-II prompt, answered directly (the small model's job).

    ``unsure``: the answer's first token is taught as an even share of every possible
    answer (the four options, or yes / no). The small model is trained so on hard items:
    a 24-32 px target is 3-5 px in its view, too little to read, and taught the right
    answer anyway it learned to be sure of its guesses (a held-out hard item's
    separability was close to an easy one's, AUC 0.69), which leaves the gate nothing
    to separate. A small model that has seen the world says how sure it can be."""
    messages = [
        *PROTOCOL.speculate_chat(image, item.question, item.options),
        Message("assistant", [item.answer]),
    ]
    if unsure:
        return Example(messages, "unsure", unsure=tuple(item.options or ("yes", "no")))
    return Example(messages)


def agent_examples(item: SynthItem, views: Views, rule: ResizeRule) -> list[Example]:
    """The screen, and every step of the item's trajectory."""
    hard = item.difficulty == "hard"
    screen = Example(
        [
            *PROTOCOL.screen_chat(views.agent, item.question, item.options),
            Message("assistant", ["yes" if hard else "no"]),
        ],
        "screen",
    )
    opening = PROTOCOL.agent_start(views.agent, item.question, item.options)
    name = name_example(item, views.agent)
    if not hard:
        direct = Example([*opening, Message("assistant", [answer_text(item)])], "direct")
        return [screen, name, direct]
    call = zoom_call(item, item.view_box(rule.size_for(SIZE, SIZE)[0]))
    observation = PROTOCOL.tool_response(views.crop)
    zoom = Example([*opening, Message("assistant", [call])], "zoom")
    after_zoom = [Message("assistant", [call]), observation]
    read = Example([*opening, *after_zoom, Message("assistant", [answer_text(item)])], "read")
    return [screen, name, zoom, read]


def make_views(item: SynthItem, small_rule: ResizeRule, agent_rule: ResizeRule) -> Views:
    original = item.render()
    crop_box = map_box(
        [float(v) for v in item.view_box(agent_rule.size_for(*original.size)[0])],
        original.size,
        agent_rule,
        PROTOCOL,
        AgentSettings(),
    )
    return Views(
        small=small_rule.apply(original),
        agent=agent_rule.apply(original),
        crop=agent_rule.apply(original, crop_box),
    )


@dataclass
class Batch:
    """Model inputs and what they are trained to predict."""

    inputs: dict[str, torch.Tensor]
    positions: torch.Tensor  # [2, N]: (row, column) of each target token
    targets: torch.Tensor  # [N]: its id
    unsure: list[tuple[int, list[int]]]  # (index into targets, ids to share evenly)


class Batcher:
    """Turns examples into model inputs plus the positions and ids of target tokens."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.processor.tokenizer.padding_side = "left"

    def __call__(self, examples: Sequence[Example]) -> Batch:
        texts, images, target_lengths = [], [], []
        encode = self.processor.tokenizer.encode
        for example in examples:
            messages, example_images = template_messages(example.messages)
            images.extend(example_images)
            texts.append(self.processor.apply_chat_template(messages, tokenize=False))
            # The target follows "assistant\n": its tokens do not merge with what precedes.
            target = "".join(str(part) for part in example.messages[-1].content)
            target_lengths.append(len(encode(target)) + 1)  # + <|im_end|>
        inputs = self.processor(text=texts, images=images, padding=True, return_tensors="pt")
        end = inputs["input_ids"].shape[1] - 1  # the newline after <|im_end|> is no target
        rows = [row for row, n in enumerate(target_lengths) for _ in range(n)]
        cols = [col for n in target_lengths for col in range(end - n, end)]
        positions = torch.tensor([rows, cols])
        targets = inputs["input_ids"][positions[0], positions[1]]
        firsts = [0, *itertools.accumulate(target_lengths)][: len(examples)]
        unsure = [
            (
                first + len(encode(example.unsure_after)) if example.unsure_after else first,
                sorted({encode(answer)[0] for answer in example.unsure}),
            )
            for first, example in zip(firsts, examples, strict=True)
            if example.unsure
        ]
        return Batch(dict(inputs), positions, targets, unsure)


def target_logits(
    model: Any, inputs: dict[str, torch.Tensor], positions: torch.Tensor
) -> torch.Tensor:
    """The logits that predict the target tokens, and only those."""
    hidden = model.model(**inputs).last_hidden_state  # [B, T, H]
    return model.lm_head(hidden[positions[0], positions[1] - 1])  # t-1 predicts token t


def by_kind(examples: Sequence[Example]) -> dict[str, list[Example]]:
    groups: dict[str, list[Example]] = {}
    for example in examples:
        groups.setdefault(example.kind, []).append(example)
    return groups


def target_loss(model: Any, batch: Batch) -> tuple[torch.Tensor, float]:
    """Cross-entropy of the target tokens; logits only where they are predicted."""
    logits = target_logits(model, batch.inputs, batch.positions)
    wanted: torch.Tensor = batch.targets  # token ids, or a distribution per token
    if batch.unsure:  # only then a [tokens, vocabulary] matrix
        wanted = torch.nn.functional.one_hot(batch.targets, logits.shape[-1]).float()
        for index, ids in batch.unsure:
            wanted[index] = 0.0
            wanted[index, ids] = 1.0 / len(ids)
    loss = torch.nn.functional.cross_entropy(logits, wanted)
    accuracy = (logits.argmax(-1) == batch.targets).float().mean().item()
    return loss, accuracy


def batch_loss(
    model: Any, batcher: Batcher, batch: Sequence[Example]
) -> tuple[torch.Tensor, float]:
    """The loss of a mixed batch, run as one sub-batch per kind of example: padding every
    example to the longest (a read after a zoom is ~600 tokens, a screen ~100) made
    the agent's steps ~1.5x slower. Each sub-batch weighs by its target tokens."""
    parts = [batcher(group) for group in by_kind(batch).values()]
    total = sum(len(part.targets) for part in parts)
    loss, right = torch.zeros(()), 0.0
    for part in parts:
        part_loss, part_accuracy = target_loss(model, part)
        loss = loss + part_loss * (len(part.targets) / total)
        right += part_accuracy * len(part.targets)
    return loss, right / total


@torch.no_grad()
def probe(model: Any, batcher: Batcher, examples: Sequence[Example]) -> dict[str, float]:
    """Per kind, the share of ``examples`` whose whole target the model gets right
    (teacher forced, each token the argmax): held-out progress while training."""
    shares = {}
    for kind, group in sorted(by_kind(examples).items()):
        right = 0
        for start in range(0, len(group), 16):
            chunk = group[start : start + 16]
            part = batcher(chunk)
            wrong = target_logits(model, part.inputs, part.positions).argmax(-1) != part.targets
            right += len(chunk) - len(set(part.positions[0][wrong].tolist()))
        shares[kind] = right / len(group)
    return shares


def _shares(shares: dict[str, float]) -> str:
    return "  ".join(f"{kind} {share:.0%}" for kind, share in shares.items())


@dataclass
class TrainReport:
    steps: int
    seconds: float
    loss: float
    token_accuracy: float
    held_out: dict[str, float] | None = None  # probe() at the end
    # every probe as it learned: [seconds into the stage, probe()], the end's last
    curve: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    gave_up: bool = False  # stopped early: ``give_up`` said the run would not learn
    attempts: int = 1  # runs started (the small model starts over while it has not learned)


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
    train_patches: bool = False,
    held_out: Sequence[Example] = (),
    give_up: Callable[[dict[str, float], float], bool] | None = None,
    on_log: Callable[[str], None] = print,
) -> TrainReport:
    """Train the checkpoint in place for ``minutes`` of wall time, then save it.

    Batches mix kinds of example, each kind drawn as often as ``weights`` says (single
    -kind batches were tried: the model stopped looking at the image). The learning rate
    warms up, then follows a cosine over the time budget down to a tenth. Every
    ``PROBE_SECONDS`` and at the end, the ``held_out`` examples are probed and logged;
    when ``give_up(shares, seconds)`` says so at a probe, training stops there.
    """

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32)
    model.train()
    # The patch embedding stays at its random init: a random projection of pixel patches
    # keeps their colour, and its backward pass is the single most expensive op here.
    model.model.visual.patch_embed.requires_grad_(train_patches)
    batcher = Batcher(load_processor(str(checkpoint)))
    examples = [example for item, views in pool for example in make_examples(item, views)]
    per_kind = Counter(example.kind for example in examples)
    draw = [(weights or {}).get(e.kind, 1.0) / per_kind[e.kind] for e in examples]
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    warmup, budget = 50, minutes * 60
    started, step, smoothed, accuracy = time.monotonic(), 0, 0.0, 0.0
    next_probe, gave_up = PROBE_SECONDS, False
    curve: list[tuple[float, dict[str, float]]] = []
    while (elapsed := time.monotonic() - started) < budget:
        if held_out and elapsed >= next_probe:
            shares = probe(model, batcher, held_out)
            curve.append((round(elapsed), shares))
            on_log(f"  held-out at {elapsed:4.0f} s: {_shares(shares)}")
            next_probe += PROBE_SECONDS
            if give_up and give_up(shares, elapsed):
                gave_up = True
                break
        batch = rng.choices(examples, draw, k=batch_size)
        loss, accuracy_now = batch_loss(model, batcher, batch)
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
    seconds = time.monotonic() - started
    shares = probe(model, batcher, held_out) if held_out else None
    if shares:
        curve.append((round(seconds), shares))
        on_log(f"  held-out at the end: {_shares(shares)}")
    model.save_pretrained(checkpoint)
    # served with the protocol it was trained on, never another (common.models.registry)
    (checkpoint / "speceyes.json").write_text(json.dumps({"protocol": PROTOCOL.name}) + "\n")
    for path in checkpoint.iterdir():
        path.chmod(0o644)
    return TrainReport(step, seconds, smoothed, accuracy, shares, curve, gave_up)


def curriculum_items(count: int, seed: int, sizes: tuple[int, int]) -> list[SynthItem]:
    """Items like hard ones (a zoom is due) but with a lone target of ``sizes``."""
    rng = random.Random(seed)
    return [
        make_item(rng.getrandbits(48), difficulty="hard", sizes=sizes, others=0)
        for _ in range(count)
    ]


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
    items_count: int = 4000,
    seed: int = 0,
    small_minutes: float = 26.0,
    large_minutes: float = 32.0,
    small_zoom_minutes: float = SMALL_ZOOM_MINUTES,
    only: str | None = None,
    on_log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train the synth models from the tiny random checkpoints into ``out/{small,large}``
    (``only="small"`` or ``"large"``: that one alone, keeping the other and the rest of
    ``out/synth-info.json``; ``"small-zoom"``: the small model's zoom stage alone, on the
    small checkpoint already in ``out``).

    The two train one after the other, each on every core. At once, in two processes of
    one thread each, the small model ran as many steps as alone (~4.5 a second) but the
    agent about half (1.1 a second against ~1.9 on two threads): in 27 minutes it had
    learned no zoom at all (held-out 0%, against 100% in 32 minutes alone). With two
    threads each, the small model crawled (0.6 steps a second).
    """

    roles = (only,) if only else ("small", "large")
    with tempfile.TemporaryDirectory() as scratch:
        random_models = build_tiny(Path(scratch) / "tiny")
        for role in ("small", "large"):
            if role in roles or not (out / role).exists():  # a rule_of() to read
                copy_checkpoint(random_models[role], out / role)
    set_view(out / "small", SMALL_VIEW)
    reports: dict[str, TrainReport] = {}
    stages: dict[str, float] = {}  # what this run trained: stage -> its budget in minutes
    if "small" in roles:
        reports |= train_small(out, items_count, seed, small_minutes, on_log)
        stages["small"] = small_minutes
    if "small" in roles or "small-zoom" in roles:
        reports |= train_small_zoom(
            out, items_count, seed, small_zoom_minutes, lambda line: on_log(f"small zoom | {line}")
        )
        stages["small-zoom"] = small_zoom_minutes
    if "large" in roles:
        reports |= train_agent(
            out, items_count, seed, large_minutes, lambda line: on_log(f"agent | {line}")
        )
        stages["large"] = large_minutes
    info_path = out / "synth-info.json"
    info = json.loads(info_path.read_text()) if only and info_path.exists() else {}
    # (a run of one stage keeps the others' figures: the list says which run made which)
    run = {"date": date.today().isoformat(), "stages": stages, "seed": seed, "items": items_count}
    info["runs"] = [*info.get("runs", []), run]
    info.update(
        {
            "items": items_count,
            "seed": seed,
            "world": "speceyes-synth-v2",
            "small_view": SMALL_VIEW,
            "learning_rates": LEARNING_RATES,
            "agent_curriculum": [[*sizes, minutes] for sizes, minutes in LOCALISATION_CURRICULUM],
            "agent_weights": AGENT_WEIGHTS,
            "small_warmup_minutes": SMALL_WARMUP_MINUTES,
            "small_weights": SMALL_WEIGHTS,
            "small_takeoff": TAKEOFF,
            "small_zoom_curriculum": [
                [*sizes, minutes] for sizes, minutes in SMALL_ZOOM_CURRICULUM
            ],
            "small_zoom_minutes": small_zoom_minutes,
            "small_zoom_weights": SMALL_ZOOM_WEIGHTS,
            **{role: report.__dict__ for role, report in reports.items()},
        }
    )
    info_path.write_text(json.dumps(info, indent=2))
    return info


def train_small(
    out: Path,
    items_count: int,
    seed: int,
    minutes: float,
    on_log: Callable[[str], None] = print,
) -> dict[str, TrainReport]:
    """The small model: lone shapes first, then the world; started over with another seed
    while picking the named shape has not taken off."""

    def log(line: str) -> None:
        on_log(f"small | {line}")

    rules = rule_of(out / "small"), rule_of(out / "large")
    rng = random.Random(seed + 100)
    lone = [make_item(rng.getrandbits(48), difficulty="easy", others=0) for _ in range(600)]
    lone_pool = [(item, make_views(item, *rules)) for item in lone]
    held_out = [
        replace(small_example(item, views.small), kind=f"{item.difficulty} {item.kind}")
        for item, views in build_pool(128, seed + HELD_OUT_SEED, *rules)
    ]
    started = time.monotonic()
    pool = build_pool(items_count, seed, *rules)
    log(f"rendered {len(pool)} training items in {time.monotonic() - started:.0f} s")
    initial = out / "small-initial"
    copy_checkpoint(out / "small", initial)
    takeoff_minutes, takeoff_share = TAKEOFF
    deadline = time.monotonic() + minutes * 60  # training time: the rendering is not in it

    def give_up(shares: dict[str, float], seconds: float) -> bool:
        time_for_another = (
            deadline - time.monotonic()
        ) / 60 > SMALL_WARMUP_MINUTES + 2 * takeoff_minutes
        late = seconds >= takeoff_minutes * 60 and shares.get("easy choice", 1.0) < takeoff_share
        if late and time_for_another:
            log("  picking the named shape has not taken off: starting over")
        return late and time_for_another

    reports: dict[str, TrainReport] = {}
    for attempt in range(1, 100):
        attempt_seed = seed + 1000 * (attempt - 1)
        copy_checkpoint(initial, out / "small")
        log(
            f"attempt {attempt} (seed {attempt_seed}): lone shapes for {SMALL_WARMUP_MINUTES:g} min"
        )
        reports["small-warmup"] = train(
            out / "small",
            lambda item, views: [name_example(item, views.small), small_example(item, views.small)],
            lone_pool,
            minutes=SMALL_WARMUP_MINUTES,
            lr=LEARNING_RATES["small"],
            seed=attempt_seed + 100,
            on_log=log,
        )
        remaining = max(LAST_STAGE_MINUTES, (deadline - time.monotonic()) / 60)
        log(f"the world for {remaining:.1f} min")
        reports["small"] = train(
            out / "small",
            small_examples,
            pool,
            minutes=remaining,
            weights=SMALL_WEIGHTS,
            lr=LEARNING_RATES["small"],
            seed=attempt_seed,
            held_out=held_out,
            give_up=give_up,
            on_log=log,
        )
        if not reports["small"].gave_up:
            break
    shutil.rmtree(initial)
    reports["small"].attempts = attempt
    return reports


def small_examples(item: SynthItem, views: Views) -> list[Example]:
    """The small model's examples of an item: the answer and the auxiliary steps."""
    hard = item.difficulty == "hard"
    named = item
    if hard and item.others:  # naming a shape by its colour needs one it can see
        named = replace(item, shape=item.others[0].shape, colour=item.others[0].colour)
    return [
        small_example(item, views.small, unsure=hard),
        name_example(named, views.small),
        kind_example(item, views.small),
    ]


def misread_examples(item: SynthItem, rule: ResizeRule) -> list[Example]:
    """A zoom into the wrong cell (another shape's), then an answer it must not be sure
    of (its first token taught as an even share of the possible answers): a first run
    that learned to zoom but not yet where (3% of its boxes on the target's cell) read
    whatever the crop held as surely as the right crop, and the gate took those guesses
    (45% right on the tool-heavy split, against 97% at depth 0)."""
    if not item.others:
        return []
    x1, y1, x2, y2 = item.others[0].box
    col, row = (x1 + x2) // 2 // CELL, (y1 + y2) // 2 // CELL
    wrong = replace(item, cell=(col * CELL, row * CELL, (col + 1) * CELL, (row + 1) * CELL))
    views = make_views(wrong, rule, rule)
    call = zoom_call(item, wrong.view_box(rule.size_for(SIZE, SIZE)[0]))
    prefix = f"<think>{_asked(item)}the {item.shape} is not here</think> <answer>"
    messages = [
        *PROTOCOL.agent_start(views.agent, item.question, item.options),
        Message("assistant", [call]),
        PROTOCOL.tool_response(views.crop),
        Message("assistant", [f"{prefix}{item.answer}</answer>"]),
    ]
    unsure = tuple(item.options or ("yes", "no"))
    return [Example(messages, "misread", unsure=unsure, unsure_after=prefix)]


def train_small_zoom(
    out: Path, items_count: int, seed: int, minutes: float, on_log: Callable[[str], None]
) -> dict[str, TrainReport]:
    """The small model's zooms, on top of its checkpoint in ``out/small``: where lone
    targets are at its view, then the world's DeepEyes steps beside its phase-II ones."""
    rule = rule_of(out / "small")
    started = time.monotonic()

    def steps(item: SynthItem, views: Views) -> list[Example]:
        kinds = ("direct", "zoom", "read")
        found = [e for e in agent_examples(item, views, rule) if e.kind in kinds]
        return found + misread_examples(item, rule) if item.difficulty == "hard" else found

    # (views made with the small model's rule for both: its whole image, its own crop)
    held_pool = build_pool(SMALL_ZOOM_HELD_OUT, seed + HELD_OUT_SEED, rule, rule)
    held_out = [example for item, views in held_pool for example in steps(item, views)]
    held_out += [
        replace(small_example(item, views.small), kind=f"{item.difficulty} {item.kind}")
        for item, views in held_pool
        if item.difficulty == "easy"
    ]
    reports = {}
    for step, (sizes, stage_minutes) in enumerate(SMALL_ZOOM_CURRICULUM):
        on_log(f"locating lone targets of {sizes[0]}-{sizes[1]} px for {stage_minutes:g} min")
        locate = [
            (item, make_views(item, rule, rule))
            for item in curriculum_items(400, seed + 11 + step, sizes)
        ]
        reports[f"small-zoom-locate-{sizes[0]}-{sizes[1]}"] = train(
            out / "small",
            lambda item, views: [steps(item, views)[0]],  # the zoom
            locate,
            minutes=stage_minutes,
            lr=LEARNING_RATES["small"],
            seed=seed + 11 + step,
            held_out=[example for example in held_out if example.kind == "zoom"],
            on_log=on_log,
        )
    pool = build_pool(items_count, seed + 7, rule, rule)
    on_log(f"rendered {len(pool)} training items")
    remaining = max(LAST_STAGE_MINUTES, minutes - (time.monotonic() - started) / 60)
    on_log(f"the world's zooms beside its answers for {remaining:.1f} min")
    reports["small-zoom"] = train(
        out / "small",
        lambda item, views: [*small_examples(item, views), *steps(item, views)],
        pool,
        minutes=remaining,
        weights=SMALL_ZOOM_WEIGHTS,
        lr=LEARNING_RATES["small"],
        seed=seed + 7,
        held_out=held_out,
        on_log=on_log,
    )
    return reports


def train_agent(
    out: Path, items_count: int, seed: int, minutes: float, on_log: Callable[[str], None]
) -> dict[str, TrainReport]:
    """The agent: where lone targets are (zoom calls only, large to small), then the
    whole task on the world."""
    rules = rule_of(out / "small"), rule_of(out / "large")
    started = time.monotonic()
    held_out = [
        example
        for item, views in build_pool(48, seed + HELD_OUT_SEED, *rules)
        for example in agent_examples(item, views, rules[1])
        if example.kind != "name"
    ]
    reports = {}
    for step, (sizes, stage_minutes) in enumerate(LOCALISATION_CURRICULUM):
        on_log(f"locating lone targets of {sizes[0]}-{sizes[1]} px for {stage_minutes:g} min")
        locate = [
            (item, make_views(item, *rules))
            for item in curriculum_items(400, seed + 1 + step, sizes)
        ]
        reports[f"locate-{sizes[0]}-{sizes[1]}"] = train(
            out / "large",
            lambda item, views: [agent_examples(item, views, rules[1])[-2]],  # the zoom
            locate,
            minutes=stage_minutes,
            seed=seed + 1 + step,
            held_out=[example for example in held_out if example.kind == "zoom"],
            on_log=on_log,
        )
    pool = build_pool(items_count, seed, *rules)
    on_log(f"rendered {len(pool)} training items")
    remaining = max(LAST_STAGE_MINUTES, minutes - (time.monotonic() - started) / 60)
    on_log(f"the whole task for {remaining:.1f} min")
    reports["large"] = train(
        out / "large",
        lambda item, views: agent_examples(item, views, rules[1]),
        pool,
        minutes=remaining,
        weights=AGENT_WEIGHTS,
        lr=LEARNING_RATES["large"],
        seed=seed,
        held_out=held_out,
        on_log=on_log,
    )
    return reports


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
