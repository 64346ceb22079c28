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

from tests.helpers.hostile_programs import INT80
from tests.helpers.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]
WORKER_UID = 65532
SCRIPT = """
import json, os, sys
REPO = sys.argv[1]
from common.config import SandboxSettings
from common.sandbox import Sandbox, probe_request

# (1 CPU-s within 8 s of wall clock: the loop reaches its CPU limit on a busy machine too)
limits = SandboxSettings(wall_s=8.0, cpu_s=1, memory_mb=512, disk_mb=16, files=256)
sandbox = Sandbox(limits)
sandbox.check()
INT80 = %r
programs = {
    "who": "open('/mnt/data/mine', 'w').write('x')\\nprint(os.getuid(), os.getgid())",
    "fork": "import os\\nwhile True:\\n    os.fork()",
    "threads": "import threading, time\\nfor _ in range(1000):\\n"
               "    threading.Thread(target=time.sleep, args=(60,)).start()",
    "userns": "import ctypes\\nprint(ctypes.CDLL(None).unshare(0x10000000))",
    "files": f"print(open('/etc/passwd').read() + open({REPO + '/pyproject.toml'!r}).read())",
    "secret": "print(os.environ.get('SPECEYES_DATABASE_URL', 'absent'))",
    "write": "open('/usr/evil', 'w').write('x')",
    "network": "from socket import create_connection\\ncreate_connection(('127.0.0.1', 5432), 2)",
    "exec": "os.execv('/bin/sh', ['sh', '-c', 'id'])",
    "parent": f"os.kill({os.getpid()}, 9)",
    "memory": "x = 'x' * (8 << 30)",
    "cpu": "x = 0\\nwhile True:\\n    x += 1",
    "wall": "import time\\ntime.sleep(10 ** 6)",
    "output": "data = b'x' * 1_000_000\\nfor _ in range(100):\\n    os.write(1, data)",
    "exit": "import os\\nos._exit(137)",
    "int80": INT80,
    "times": "import os\\nfor node in ('/dev/null', '/dev/urandom'):\\n"
             "    try:\\n        os.utime(node)\\n    except Exception as exc:\\n"
             "        print(node, exc.strerror)",
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
    """Each row of docs/sandbox.md's table in a worker that is not root (one program a
    row, and what the table says differs here: no control group, no tmpfs)."""
    times = {node: os.stat(node).st_mtime_ns for node in ("/dev/null", "/dev/urandom")}
    with_secret = [*worker[:-2], "SPECEYES_DATABASE_URL=postgresql://u:hunter2@db/p", *worker[-2:]]
    script = SCRIPT % INT80  # (the 32-bit ABI's getpid, as test_programs.py runs it)
    done = subprocess.run(
        [*with_secret, script, str(REPO)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    setup, runs, owner = lines[0], {line["name"]: line for line in lines[1:-1]}, lines[-1]
    assert setup == {"group": False, "mounted": False, "owner": None}
    assert runs["who"]["said"] == "65534 65534"  # inside: nobody ...
    assert owner == {"owner": WORKER_UID}  # ... which is the worker outside, not root
    assert "Operation not permitted" in runs["fork"]["said"]
    assert "can't start new thread" in runs["threads"]["said"]  # RLIMIT_NPROC binds here
    assert runs["userns"]["said"] == "-1"
    assert "No such file" in runs["files"]["said"] and runs["secret"]["said"] == "absent"
    assert "Read-only" in runs["write"]["said"]
    assert "Operation not permitted" in runs["network"]["said"]
    assert "not permitted" in runs["exec"]["said"]
    assert "not permitted" in runs["parent"]["said"]  # (signals to itself only)
    assert "MemoryError" in runs["memory"]["said"]  # (the address space: no group here)
    assert runs["cpu"]["stop"] == "cpu_limit" and runs["wall"]["stop"] == "timeout"
    assert runs["output"]["stop"] == "output_limit"
    assert runs["exit"]["said"].startswith("exit 137")  # (not SIGKILL)
    assert "SIGSYS" in runs["int80"]["said"]
    assert runs["disk"]["said"] == "written"  # 32 MiB: nothing caps it while it runs ...
    assert runs["after"]["stop"] == "disk_limit"  # ... but the next execution is refused
    assert "over its budget of 16 MiB" in runs["after"]["said"]
    # the device nodes it sees are the host's (no nodes of its own without root): any
    # writer may set their times to now, so setting times is refused here
    assert runs["times"]["said"] == (
        "/dev/null Operation not permitted\n/dev/urandom Operation not permitted"
    )
    assert times == {node: os.stat(node).st_mtime_ns for node in times}
    assert not list(Path("/tmp").glob("speceyes-sandbox-*-*/fs/f0"))  # removed after
    assert subprocess.run(["pgrep", "-u", str(WORKER_UID)], capture_output=True).stdout == b""


VIEWS = """
import json
from common.config import SandboxSettings
from common.sandbox import Sandbox, worker_bytes
from tests.helpers.sandbox import CHURN, VIEW_ATTACKS, view_attack

sandbox = Sandbox(SandboxSettings())
for name, steps in VIEW_ATTACKS.items():
    use, trajectory = view_attack(name, sandbox)
    print(json.dumps({"name": name, "growth": use.memory_growth, "cpu_s": use.cpu_s,
                      "executions": len(steps), "answer": trajectory.answer,
                      "said": trajectory.steps[0].observation,
                      "bound": worker_bytes(sandbox.limits) + CHURN}))
"""


def test_an_unprivileged_worker_holds_only_what_the_model_sees(worker):
    """The thin, forged-thin and accumulating images of ``test_views.py``, at the
    default settings, in a worker that is not root."""
    done = subprocess.run([*worker, VIEWS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for run in map(json.loads, done.stdout.splitlines()):
        assert run["answer"] == "B", run
        assert run["growth"] <= run["bound"], run
        assert run["cpu_s"] <= 2.0 * run["executions"], run
        assert (
            "left out" in run["said"]
            or "wrote more than" in run["said"]
            or ("image(s) returned" in run["said"])
        ), run


SLEEPER = """
from common.config import SandboxSettings
from common.sandbox import Sandbox, probe_request
session = Sandbox(SandboxSettings(wall_s=60.0)).session()
print(session.workspace.root, flush=True)
code = "open('/mnt/data/started', 'w').close()\\nimport time\\ntime.sleep(60)"
session.run({**probe_request(session), "code": code})
"""


def test_an_unprivileged_workers_guest_dies_with_it(worker):
    sleeper = subprocess.Popen([*worker, SLEEPER], stdout=subprocess.PIPE, text=True)
    assert sleeper.stdout is not None
    root = Path(sleeper.stdout.readline().strip())
    wait_until(
        (root / "fs" / "data" / "started").exists, deadline_s=15, every_s=0.02, what="the code"
    )
    sleeper.kill()
    sleeper.wait()
    wait_until(
        lambda: not _processes_of(WORKER_UID),
        deadline_s=5,
        every_s=0.05,
        what=lambda: f"no process of the worker's uid: {_processes_of(WORKER_UID)}",
    )
    shutil.rmtree(root)  # (the next sandbox of that uid would sweep it)


def _processes_of(uid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-u", str(uid)], capture_output=True, text=True)
    return found.stdout.split()
