"""Phase IV for Thyme: the model writes Python that works on the image, and goes on.

Following the SpecEyes evaluation of Thyme (``eval_code_thyme/utils.py``,
``run_evaluation``), with the strings of ``common.protocols.thyme``:

1. The image goes into the trajectory's private sandbox folder: a V* file as it is, also
   where the reader kept the reference's pixels of it for the models (an EXIF
   orientation, a palette, alpha); the job's own file where it is a JPEG (as the
   evaluation hands V*'s files over); else saved as an RGB JPEG at quality 95 (as it
   saves HR-Bench's and POPE's); the first user turn shows that file,
   the question, its path and its size "WxH", so the code opens the file and works in
   original pixels. A benchmark image is placed and named as the evaluation names it
   (``data/vstar/SPLIT/NAME.jpg``, ``./eval_code_thyme/_tmp_hr_images/SPLIT/N.jpg``,
   relative to the code's working folder); any other is ``/mnt/data/image.jpg``.
2. Each iteration generates until ``</code>`` or ``</answer>`` (or the end of the turn).
   The first renders with a generation prompt; later ones render without one and with
   the final ``<|im_end|>\\n`` cut off, so the model continues the last turn.
3. A code block runs in the sandbox (``common.sandbox``; a fresh process each time).
   What it hands back (the images it saved and named, else its printed text) is appended
   to the SAME assistant turn: the step's text, ``<sandbox_output>``, the images (on the
   model's grid) or the text, ``</sandbox_output>``. The images are resized to the grid
   inside the sandbox, and a trajectory is shown at most ``sandbox.view_tokens`` visual
   tokens of them in all (ours: the evaluation has no bound): an image past it, or of a
   shape no model is shown (an aspect ratio over 200), is left out, which the step's
   observation says.
4. An execution that hands nothing back (an exception, refused code, over a limit) drops
   the step's text, as the evaluation does, and the next iteration generates again from
   the same conversation (so the iteration still counts).
5. An ``</answer>`` ends the trajectory; so does text with neither code nor an answer
   (not added to the turn), or the end-of-turn token. The answer is the first
   ``<answer>..</answer>`` of the last assistant turn; none means the trajectory ends
   as an error (``no_answer``), never a guess.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import time
from pathlib import PurePosixPath
from typing import Any

from PIL import Image

from common.agents.trajectory import AgentStep, Trajectory, kept_if_stopped
from common.backends.base import VisionLanguageModel
from common.chat import Conversation, Message, Part
from common.config import AgentSettings, ImageSettings
from common.contracts import Query
from common.errors import ImageError, SourceUnavailable
from common.images import check_image, image_suffix, original_of
from common.protocols import Protocol
from common.protocols import thyme as THYME
from common.sandbox import QWEN25_GRID, Sandbox, SandboxSession, view_request
from common.sandbox.channel import Grid
from common.sources.reading import read_located

_CODE = re.compile(THYME.CODE_BLOCK, re.IGNORECASE)
_ANSWER = re.compile(THYME.ANSWER, re.DOTALL)
THUMBNAIL_SIDE = 256  # the trace keeps each produced image this small
IMAGE_NAME = "image.jpg"
OUTPUT_FOLDER = "temp_processed_images"  # in the sandbox: where THYME.OUTPUT_DIR points


def run_thyme(
    query: Query,
    model: VisionLanguageModel,
    limits: AgentSettings | None = None,
    sandbox: Sandbox | None = None,
) -> Trajectory:
    """Run one Thyme trajectory to an answer or to a clear error."""
    limits = limits or AgentSettings()
    sandbox = sandbox or Sandbox(limits.sandbox)
    with sandbox.session() as session:
        loop = _Loop(query, model, limits, session)
        with kept_if_stopped(loop.trajectory):
            return loop.run()


class _Loop:
    def __init__(
        self,
        query: Query,
        model: VisionLanguageModel,
        limits: AgentSettings,
        session: SandboxSession,
    ) -> None:
        self.query, self.model, self.limits, self.session = query, model, limits, session
        self.protocol: Protocol = model.protocol
        self.conversation = Conversation(key=query.job_id)
        self.trajectory = Trajectory()
        self.written: list[str] = []  # the model's own text in the assistant turn
        self.image_path = image_place(query, session)[0]  # as the code is handed it
        self.grid = model_grid(self.protocol)
        # what the code's images may still take of the model's context, in visual tokens
        self.tokens_left = limits.sandbox.view_tokens

    def run(self) -> Trajectory:
        self.conversation.messages += start(self.query, self.protocol, self.session)
        for index in range(self.limits.max_steps):
            step, finished = self._iterate(index)
            self.trajectory.steps.append(step)
            if finished:
                break
        return self._conclude()

    def _iterate(self, index: int) -> tuple[AgentStep, bool]:
        """One generation and what follows it; True when the trajectory is over."""
        started = time.perf_counter()
        self.conversation.continue_cut = THYME.CONTINUE_CUT if index > 0 else None
        generation = self.model.generate(
            self.conversation,
            stop=self.protocol.agent_stop,
            max_new_tokens=self.limits.max_new_tokens,
        )
        self.conversation.generations += 1
        text = generation.text
        step = AgentStep(
            index=index,
            text=text,
            finish_reason=generation.finish_reason,
            new_tokens=generation.new_tokens,
            prompt_tokens=generation.prompt_tokens,
            generate_seconds=time.perf_counter() - started,
            model_seconds=generation.seconds,
        )
        answered = "</answer>" in text
        content: list[Part] = [text] if answered else []
        match = _CODE.search(text)
        if match is not None:
            view = view_request(self.grid, self.tokens_left)
            handed_back = execute(
                self.session, self.protocol, step, match.group(1).strip(), self.image_path, view
            )
            if handed_back is None:
                return step, False  # dropped: the next iteration generates again
            shown = sum(p.width * p.height for p in handed_back if isinstance(p, Image.Image))
            self.tokens_left -= shown // self.grid.factor**2
            content += [text, THYME.SANDBOX_OPEN, *handed_back, THYME.SANDBOX_CLOSE]
        elif not answered:
            step.observation = "ended: neither code nor an answer"
            return step, True
        self._extend_turn(content)
        return step, answered or generation.finish_reason == "eos"

    def _extend_turn(self, content: list[Part]) -> None:
        """Start the assistant turn, or add to it (Thyme's output stays in one turn)."""
        self.written.append(content[0] if isinstance(content[0], str) else "")
        messages = self.conversation.messages
        if messages[-1].role == "assistant":
            messages[-1].content += content
        else:
            messages.append(Message("assistant", content))

    def _conclude(self) -> Trajectory:
        # The first <answer> of the turn, as the evaluation takes it, but in what the
        # model wrote only: its code's printed output is in the turn too, and could
        # otherwise set the answer (the same whenever that output holds no answer tag).
        match = _ANSWER.search("".join(self.written))
        if match is not None:
            as_reference = self.protocol.malformed == "reference"
            self.trajectory.conclude(match.group(1).strip(), as_reference=as_reference)
        else:
            self.trajectory.error_code = "no_answer"
            self.trajectory.error = (
                f"no <answer> after {len(self.trajectory.steps)} generation(s) "
                f"(at most {self.limits.max_steps})"
            )
        return self.trajectory


def start(query: Query, protocol: Protocol, session: SandboxSession) -> list[Message]:
    """The system prompt and the first user turn, the job's image placed in the sandbox
    as the file the turn names (``place_image``, ``image_place``)."""
    image = place_image(query, session)
    first_turn = protocol.agent_first_turn.format(
        question=protocol.question_block(query.question, query.options),
        path=image_place(query, session)[0],
        size=f"{image.width}x{image.height}",
    )
    return [
        Message("system", [protocol.agent_system]),
        Message("user", [protocol.file_view(image), first_turn]),
    ]


def place_image(query: Query, session: SandboxSession) -> Image.Image:
    """The job's image as the sandbox's file, and as the model sees that file: a V* file
    the reader kept the reference's pixels of (an EXIF orientation, a palette, alpha)
    as the file itself (``original_of``: the evaluation hands V*'s files to the code as
    they are), shown as those pixels; else the job's own file where it is a benchmark's
    (``_own_file``) or a JPEG; else the image saved as an RGB JPEG at quality 95 (as the
    evaluation saves HR-Bench's and POPE's)."""
    data = original_of(query.image_path)
    shown = None if data is None else query.image  # (the file's pixels as the reference's)
    if data is None:
        data = _own_file(query)
    if data is None:
        buffer = io.BytesIO()
        query.image.convert("RGB").save(buffer, format="JPEG", quality=THYME.JPEG_QUALITY)
        data = buffer.getvalue()
    place = session.folder / image_place(query, session)[2]
    place.parent.mkdir(parents=True, exist_ok=True)
    place.write_bytes(data)
    return shown if shown is not None else Image.open(io.BytesIO(data)).convert("RGB")


def image_place(query: Query, session: SandboxSession) -> tuple[str, str, str]:
    """Where the job's image is: (the path the first turn names and the code is handed as
    ``image_path``, as the evaluation hands it; the same as an absolute path; the file in
    the sandbox folder). A benchmark image is named as Thyme's evaluation names it
    (``Query.shown_path``, relative to the code's working folder, which is the sandbox
    folder); any other, or a path that would leave the folder, is ``image.jpg`` there."""
    relative = _inside_folder(query.shown_path)
    if relative is None:
        return session.inside(IMAGE_NAME), session.inside(IMAGE_NAME), IMAGE_NAME
    assert query.shown_path is not None
    return query.shown_path, session.inside(relative), relative


def _inside_folder(path: str | None) -> str | None:
    """``path`` as a plain relative path below a folder ("./a/b.jpg" -> "a/b.jpg"), or
    None where it is absolute, climbs out, or holds what a file name should not."""
    if not path or path.startswith("/") or "\x00" in path or "\n" in path:
        return None
    parts = [part for part in PurePosixPath(path).parts if part != "."]
    if not parts or any(part == ".." for part in parts):
        return None
    return "/".join(parts)


def _own_file(query: Query) -> bytes | None:
    """The bytes of the job's file where it is a benchmark's (the first turn names it by
    the evaluation's path, ``shown_path``: the evaluation hands V*'s file as it is,
    whatever its format) or a JPEG, checked again within the limits; None otherwise, or
    if it cannot be read now."""
    if query.image_path is None:
        return None
    try:  # (a file, a tar member, a table cell or a remote object: common.sources.locations)
        data = read_located(query.image_path, ImageSettings())
        if query.shown_path is None and image_suffix(data) != ".jpeg":
            return None
        check_image(data, ImageSettings())
    except (ImageError, SourceUnavailable):  # (re-encoded from the decoded image instead)
        return None
    return data


def model_grid(protocol: Protocol) -> Grid:
    """The grid the model is shown images on (Qwen2.5-VL's where the protocol leaves it
    to the processor), with the aspect ratio Qwen's processors take at most."""
    rule = protocol.image_grid
    if rule is None:
        return QWEN25_GRID
    return Grid(rule.factor, rule.min_pixels, rule.max_pixels, QWEN25_GRID.max_aspect)


def execute(
    session: SandboxSession,
    protocol: Protocol,
    step: AgentStep,
    code: str,
    image_path: str,
    view: dict[str, Any],
) -> list[Part] | None:
    """Run the step's code in ``session``; what goes back to the model, or None when
    nothing does. Whatever the code did, the step keeps the code and an observation.
    ``view``: the grid the images come back on, and the pixels they may hold."""
    step.code = code
    started = time.perf_counter()
    execution = session.run(
        {
            "code": code,
            "image_path": image_path,
            "output_dir": session.inside(OUTPUT_FOLDER),
            "model_output_dir": THYME.OUTPUT_DIR,
            "refused": list(THYME.REFUSED_CODE),
            "min_crop_side": THYME.MIN_CROP_SIDE,
            "view": view,
        }
    )
    step.tool_seconds = time.perf_counter() - started
    step.sandbox_stop = execution.stop
    step.sandbox_cpu_s = round(execution.cpu_s, 3)
    step.sandbox_peak_mb = round(execution.peak_bytes / 2**20, 1)
    report = execution.report
    if report is None:
        step.observation = f"execution failed, step dropped: {execution.detail}"
        return None
    step.code_output = report.printed
    notes = "".join(f"; {note}" for note in report.notes)
    if report.text is not None:
        step.observation = "printed text returned" + notes
        return [_inert(report.text)]
    views: list[Part] = []
    described = []
    for image in report.images:
        try:
            views.append(protocol.view(image))
        except ImageError as exc:  # an image the model cannot be shown (its shape)
            notes += f"; an image left out: {exc}"
            continue
        described.append(_describe(image))
    if not views:
        why = report.error or ("its images are left out" if notes else "it handed nothing back")
        step.observation = f"execution failed, step dropped: {why}{notes}"
        return None
    step.images = described
    step.observation = f"{len(views)} image(s) returned{notes}"
    return views


def _inert(text: str) -> str:
    """Printed text as the model may read it: a chat template's special tokens in it
    (``<|im_end|>``, ``<|image_pad|>``) would be read as real ones, ending the turn or
    asking for an image that is not there, so their brackets are broken apart."""
    return text.replace("<|", "< |").replace("|>", "| >")


def _describe(image: Image.Image) -> dict[str, Any]:
    """A produced image as the trace keeps it: the size the code saved it at, the size
    and digest of what the model was shown, a small PNG thumbnail (made without a
    full-size copy)."""
    digest = (image.info.get("pixels_sha256") or hashlib.sha256(image.tobytes()).hexdigest())[:16]
    scale = THUMBNAIL_SIDE / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    thumbnail = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=2.0)
    buffer = io.BytesIO()
    thumbnail.save(buffer, format="PNG")
    encoded = base64.b64encode(buffer.getvalue()).decode()
    source = image.info.get("source_size", image.size)
    return {
        "width": source[0],
        "height": source[1],
        "shown_width": image.width,
        "shown_height": image.height,
        "pixels_sha256": digest,
        "thumbnail": f"data:image/png;base64,{encoded}",
    }
