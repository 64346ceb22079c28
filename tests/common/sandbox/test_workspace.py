"""A session's workspace: made bounded, counted where it cannot be bounded, and removed
whatever the code left in it, without recursion and without following a link."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from common.sandbox import workspace
from common.sandbox.workspace import Workspace, remove_tree

UID = 65533


def test_a_chain_of_3000_folders_is_removed(tmp_path):
    top = tmp_path / "top"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(3000):  # far past PATH_MAX (4096) as one path
        os.mkdir("dddd", dir_fd=fd)
        below = os.open("dddd", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = below
    open(os.open("leaf.txt", os.O_CREAT | os.O_WRONLY, dir_fd=fd), "w").close()
    os.close(fd)
    remove_tree(top)
    assert not top.exists() and tmp_path.exists()


def test_links_fifos_and_locked_folders_are_removed_and_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the host's")
    top = tmp_path / "top"
    (top / "sub" / "locked").mkdir(parents=True)
    (top / "sub" / "locked" / "f").write_text("x")
    (top / "to-outside").symlink_to(outside)
    (top / "loop").symlink_to(top / "loop")
    (top / "sub" / "up").symlink_to("../..")
    os.mkfifo(top / "fifo.png")
    os.link(outside / "keep.txt", top / "hard.txt")
    (top / "sub" / "locked").chmod(0)
    (top / "sub").chmod(0)
    remove_tree(top)
    assert not top.exists()
    assert (outside / "keep.txt").read_text() == "the host's"  # the link was removed, only


def test_without_a_mount_the_folder_is_counted_against_its_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # a worker that cannot mount
    opened = Workspace(uid=UID, gid=UID, disk_bytes=1 << 20, files=50)
    try:
        assert not opened.mounted and opened.over_budget() is None
        for index in range(60):
            (opened.tmp / f"f{index}").touch()
        assert "over its budget of 1 MiB and 50 files" in opened.over_budget()
        for index in range(60):
            (opened.tmp / f"f{index}").unlink()
        (opened.data / "big").write_bytes(b"x" * (2 << 20))
        assert "over its budget" in opened.over_budget()
    finally:
        opened.remove()
    assert not opened.root.exists()


def test_as_root_it_is_a_tmpfs_that_goes_with_the_session():
    if os.geteuid() != 0:
        pytest.skip("only root mounts")
    opened = Workspace(uid=UID, gid=UID, disk_bytes=1 << 20, files=64)
    try:
        assert opened.mounted and opened.fs.is_mount()
        assert (opened.root.stat().st_mode & 0o777) == 0o700
        assert opened.data.stat().st_uid == UID and opened.tmp.stat().st_uid == UID
        with pytest.raises(OSError, match="No space left"):
            (opened.data / "big").write_bytes(b"x" * (2 << 20))
    finally:
        opened.remove()
    assert not opened.root.exists()
    assert str(opened.fs) not in Path("/proc/self/mountinfo").read_text()


def test_the_folders_of_a_dead_worker_are_swept(tmp_path):
    gone = subprocess.Popen(["true"])  # a worker's pid that existed and is gone
    gone.wait()
    stale = Path(tempfile.gettempdir()) / f"{workspace.PREFIX}{gone.pid}-test"
    stale.mkdir(mode=0o700)
    (stale / "fs" / "deep").mkdir(parents=True)
    mounted = os.geteuid() == 0
    if mounted:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", stale / "fs"], check=True)
        (stale / "fs" / "x").write_text("left by the dead worker")
    alive = Path(tempfile.gettempdir()) / f"{workspace.PREFIX}{os.getpid()}-mine"
    alive.mkdir()
    try:
        workspace.sweep_stale()
        assert not stale.exists() and alive.exists()
        assert str(stale) not in Path("/proc/self/mountinfo").read_text()
    finally:
        alive.rmdir()


def test_a_planted_name_is_never_followed_by_the_sweep(tmp_path):
    """Anyone may create ``/tmp/speceyes-sandbox-<dead pid>-x``: a link there, or a folder
    not ours, is left alone, and nothing it points at is unmounted or removed."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    victim = tmp_path / "victim"
    (victim / "fs").mkdir(parents=True)
    (victim / "fs" / "keep").write_text("the host's")
    planted = Path(tempfile.gettempdir()) / f"{workspace.PREFIX}{gone.pid}-planted"
    linked = Path(tempfile.gettempdir()) / f"{workspace.PREFIX}{gone.pid}-linked"
    planted.mkdir(mode=0o700)
    (planted / "fs").symlink_to(victim / "fs")
    linked.symlink_to(victim)
    mounted = os.geteuid() == 0
    if mounted:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", victim / "fs"], check=True)
        (victim / "fs" / "keep").write_text("the host's")
    try:
        workspace.sweep_stale()
        assert (victim / "fs" / "keep").read_text() == "the host's"
        assert not mounted or os.path.ismount(victim / "fs")
        assert linked.is_symlink()  # not ours: left as found
    finally:
        if mounted:
            subprocess.run(["umount", victim / "fs"], check=True)
        linked.unlink()
        if planted.exists():
            (planted / "fs").unlink(missing_ok=True)
            planted.rmdir()
