"""Phase IV: the agent loop and Thyme's code sandbox."""

from __future__ import annotations

from common.config.base import AgentKind, Group, Isolation, group, setting


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
