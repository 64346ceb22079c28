"""``speceyes bench sandbox``: what one execution of model-written code costs.

Each program runs ``runs`` times in one session, with a pause between runs standing in
for the model's step: with a spare started ahead (what a Thyme trajectory gets, the
spare boots during the pause) and cold (every run starts its sandbox).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from PIL import Image

from common.errors import SpecEyesError
from common.sandbox import Isolation, Sandbox, probe_request

CROP = (
    "from PIL import Image\nimage = Image.open(image_path)\n"
    "processed_path = '/mnt/data/out/crop.png'\n"
    "image.crop((100, 100, 400, 300)).save(processed_path)\nprint(processed_path)"
)
PROGRAMS = {"print(1)": "print(1)", "crop 640x480": CROP}


@dataclass(frozen=True)
class SandboxRow:
    program: str
    spare: bool  # a spare sandbox started ahead (else a cold start per run)
    seconds: list[float]  # one per run, as the session measured it

    @property
    def median_ms(self) -> float:
        return 1000 * statistics.median(self.seconds)

    @property
    def p90_ms(self) -> float:
        ms = sorted(1000 * s for s in self.seconds)
        return ms[int(0.9 * (len(ms) - 1))]


def bench_sandbox(isolation: Isolation, runs: int, gap_s: float) -> list[SandboxRow]:
    """Every program ``runs`` times, with a spare started ahead and cold."""
    sandbox = Sandbox(isolation=isolation)
    sandbox.check()
    rows = []
    for name, code in PROGRAMS.items():
        for spare in (True, False):
            seconds = []
            with sandbox.session(spare=spare) as session:
                request = {**probe_request(session), "code": code}
                Image.new("RGB", (640, 480), (90, 120, 200)).save(session.folder / "image.jpg")
                for _ in range(runs):
                    time.sleep(gap_s)  # the model's step: the spare starts meanwhile
                    execution = session.run(request)
                    report = execution.report
                    if report is None or not (report.images or report.text):
                        raise SpecEyesError(f"{name} did not run: {execution}")
                    seconds.append(execution.seconds)
            rows.append(SandboxRow(name, spare, seconds))
    return rows
