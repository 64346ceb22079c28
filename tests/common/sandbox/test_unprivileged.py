"""A worker that is not root: bubblewrap in a user namespace of its own, no control group,
no tmpfs. The guest maps to the worker's uid (never root), bombs still meet their
limits, and the folder is counted after each execution.

The worker here is Debian's own Python as uid 65532 (the project's virtual environment
lives under /root, which only root may enter), with the environment's packages on its
path: the same code, started as an unprivileged user.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
WORKER_UID = 65532
SCRIPT = """
import json, os
from common.config import SandboxSettings
from common.sandbox import Sandbox, probe_request

limits = SandboxSettings(wall_s=3.0, cpu_s=2, memory_mb=512, disk_mb=16, files=256)
sandbox = Sandbox(limits)
sandbox.check()
programs = {
    "who": "open('/mnt/data/mine', 'w').write('x')\\nprint(os.getuid(), os.getgid())",
    "fork": "import os\\nwhile True:\\n    os.fork()",
    "threads": "import threading, time\\nfor _ in range(1000):\\n"
               "    threading.Thread(target=time.sleep, args=(60,)).start()",
    "userns": "import ctypes\\nprint(ctypes.CDLL(None).unshare(0x10000000))",
    "disk": "block = b'x' * (4 << 20)\\nfor i in range(8):\\n"
            "    open(f'/mnt/data/f{i}', 'wb').write(block)\\nprint('written')",
    "after": "print('refused?')",
}
with sandbox.session() as session:
    print(json.dumps({"group": session.group is not None, "mounted": session.workspace.mounted,
                      "owner": None}))
    for name, code in programs.items():
        run = session.run({**probe_request(session), "code": code})
        if name == "who":
            owner = (session.folder / "mine").stat().st_uid
        said = run.detail if run.report is None else (run.report.text or run.report.error)
        print(json.dumps({"name": name, "stop": run.stop, "said": said}))
    print(json.dumps({"owner": owner}))
"""


def _others_may_read(path: Path) -> bool:
    """Whether a user who is neither owner nor in the group may enter every folder down
    to ``path`` and read it."""
    if not path.stat().st_mode & stat.S_IROTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in [path, *path.parents])


@pytest.fixture
def worker() -> list[str]:
    python = shutil.which("python3.11", path="/usr/bin")
    if os.geteuid() != 0 or python is None or shutil.which("bwrap") is None:
        pytest.skip("needs root (to become another user), Debian's python3.11 and bwrap")
    site = next(p for p in map(Path, sys.path) if p.name == "site-packages" and p.is_dir())
    for needed in (REPO, site):
        if not _others_may_read(needed):
            pytest.skip(
                f"{needed} is out of another user's reach (a folder on its way is not "
                "o+x, e.g. a checkout under mktemp -d): clone where uid 65532 can read"
            )
    environment = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "PYTHONPATH": f"{REPO}:{site}",
    }
    drop = ["setpriv", f"--reuid={WORKER_UID}", f"--regid={WORKER_UID}", "--clear-groups"]
    return [*drop, "env", "-i", *(f"{k}={v}" for k, v in environment.items()), python, "-c"]


def test_an_unprivileged_worker_contains_the_same_bombs(worker):
    done = subprocess.run([*worker, SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    setup, runs, owner = lines[0], {line["name"]: line for line in lines[1:-1]}, lines[-1]
    assert setup == {"group": False, "mounted": False, "owner": None}
    assert runs["who"]["said"] == "65534 65534"  # inside: nobody ...
    assert owner == {"owner": WORKER_UID}  # ... which is the worker outside, not root
    assert "Operation not permitted" in runs["fork"]["said"]
    assert "can't start new thread" in runs["threads"]["said"]  # RLIMIT_NPROC binds here
    assert runs["userns"]["said"] == "-1"
    assert runs["disk"]["said"] == "written"  # 32 MiB: nothing caps it while it runs ...
    assert runs["after"]["stop"] == "disk_limit"  # ... but the next execution is refused
    assert "over its budget of 16 MiB" in runs["after"]["said"]
    assert not list(Path("/tmp").glob("speceyes-sandbox-*-*/fs/f0"))  # removed after
    assert subprocess.run(["pgrep", "-u", str(WORKER_UID)], capture_output=True).stdout == b""
