"""Take the review pages' screenshots in docs/images/ from the demo's batch.

    make demo && .venv/bin/python docs/screenshots.py

Serves demo.db (``speceyes serve``, a port of its own), signs in with a new admin key,
and photographs the batches, the demo batch, a job the agent zoomed on, and the review
queue, in Chromium (Debian's, through Playwright, as the browser tests drive it).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from playwright.sync_api import Page, sync_playwright

from lab.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images"
SPECEYES = [sys.executable, "-m", "cli.main"]
DB = ["--db", "sqlite:///demo.db"]


def main() -> None:
    if not (ROOT / "demo.db").exists():
        sys.exit("no demo.db: run make demo first")
    made = subprocess.run(
        [*SPECEYES, "keys", "create", "screenshots", "--admin", *DB],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        sys.exit(made.stderr.strip())
    key = made.stdout.split()[0]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [*SPECEYES, "serve", *DB, "--small", "synth", "--large", "synth", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # its access log
    )
    try:
        _wait(base)
        _shoot(base, key)
    finally:
        server.terminate()
        server.wait(timeout=60)
        revoke = [*SPECEYES, "keys", "revoke", "screenshots", *DB]
        subprocess.run(revoke, cwd=ROOT, check=False, capture_output=True)


def _wait(base: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # a server starting: nothing to poll but its port
    sys.exit("the server did not answer in 120 s")


def _shoot(base: str, key: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", chromium_sandbox=False
        )
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        page.goto(f"{base}/ui/signin")
        page.fill("input[name=key]", key)
        page.click("button[type=submit]")
        page.wait_for_url("**/ui/batches")
        page.screenshot(path=OUT / "ui-batches.png")
        page.click("table.batches a")
        page.wait_for_selector("table.grid")
        _load_every_image(page)  # (the grid's thumbnails load lazily, as a reader scrolls)
        batch_url = page.url
        page.screenshot(path=OUT / "ui-batch.png", full_page=True)
        page.goto(f"{batch_url}/results?who=large")
        page.click("table.grid td.question a")
        page.wait_for_selector("rect.zoom-box")
        page.wait_for_load_state("networkidle")  # the SVG's images load after the page
        page.screenshot(path=OUT / "ui-job.png", full_page=True)
        page.goto(f"{batch_url}/review")
        page.wait_for_selector(".entry.current")
        page.wait_for_load_state("networkidle")
        page.screenshot(path=OUT / "ui-review.png")
        browser.close()
    print(f"wrote {', '.join(sorted(p.name for p in OUT.glob('ui-*.png')))} in {OUT}")


def _load_every_image(page: Page) -> None:
    """A full-page picture shows rows no reader has scrolled to: load their images now."""
    page.evaluate("document.querySelectorAll('img').forEach(i => { i.loading = 'eager'; })")
    deadline = time.monotonic() + 30
    while not page.evaluate("[...document.images].every(i => i.complete)"):
        if time.monotonic() > deadline:
            sys.exit("the grid's images did not load in 30 s")
        page.wait_for_timeout(100)  # (the page's own CSP forbids a function polled in it)
    page.wait_for_load_state("networkidle")


if __name__ == "__main__":
    main()
