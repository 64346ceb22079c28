"""Images the code hands back cost the worker what the model is shown, never more: a
thin image (10,000,000 x 1, which the grid's 28 px minimum side would make 317 M
pixels), a forged report of four of them, and four steps of four images as large as the
limit allows, at the default settings and in each isolation that runs here. The worker
stays within ``worker_bytes`` (docs/sandbox.md's bound) and 2 CPU seconds an execution.
(A worker that is not root: ``test_unprivileged.py``.)"""

from __future__ import annotations

import pytest

from common.config import SandboxSettings
from common.sandbox import worker_bytes
from tests.helpers.sandbox import CHURN, VIEW_ATTACKS, bubblewrap_or_skip, view_attack

pytestmark = pytest.mark.sandbox

DEFAULTS = SandboxSettings()
SAID = {
    "thin": ("aspect ratio is over 200",),
    # more bytes than a view may hold, or (where its writes were cut short) no view
    "forged thin": ("wrote more than", "not the model's view"),
    "accumulating": ("image(s) returned",),
}


@pytest.mark.parametrize("isolation", ["bubblewrap", "gvisor"])
@pytest.mark.parametrize("name", list(VIEW_ATTACKS))
def test_images_cost_the_worker_what_the_model_sees(name, isolation):
    sandbox = bubblewrap_or_skip(DEFAULTS, isolation=isolation)
    use, trajectory = view_attack(name, sandbox)
    executions = len(VIEW_ATTACKS[name])
    assert trajectory.answer == "B", trajectory
    assert any(said in trajectory.steps[0].observation for said in SAID[name]), trajectory.steps[0]
    bound = worker_bytes(DEFAULTS) + CHURN
    assert use.memory_growth <= bound, f"{use.memory_growth >> 20} MiB > {bound >> 20}"
    assert use.cpu_s <= 2.0 * executions, f"{use.cpu_s:.2f} CPU s in {executions}"
    if name == "accumulating":  # two fit in 32,768 tokens; the rest are left out, said
        shown = [image for step in trajectory.steps for image in step.images or []]
        assert [(i["shown_width"], i["width"]) for i in shown] == [(3164, 3162)] * 2
        assert "over the 7230 this trajectory may still be shown" in trajectory.steps[0].observation
        assert all("left out" in step.observation for step in trajectory.steps[1:4])
