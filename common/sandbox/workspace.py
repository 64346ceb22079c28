"""The one writable place of a sandbox session, and its removal.

A session's folder (``root``, 0700, reachable by its owner alone) holds ``fs``: where the
worker runs as root, a tmpfs mounted there for the session (``disk_bytes`` and ``files``
at most, ``nosuid,nodev,noexec``, owned by the sandbox's uid), so nothing the code
writes reaches the host's disk and no file in it can gain privileges or be executed.
Inside ``fs`` are ``data`` (the code's ``/mnt/data``: the image, what the code saves)
and ``tmp`` (its ``/tmp``), so both share the one budget. A worker that is not root
cannot mount: ``fs`` is then a plain folder, counted after each execution
(``over_budget``) rather than capped while the code runs.

Removal never recurses and never follows a link: a tmpfs is unmounted (the kernel drops
its contents at once); a plain folder is walked with one open directory at a time,
however deep it goes (``remove_tree``).

Folders of sessions whose worker died are swept when the next sandbox starts
(``sweep_stale``): they are named ``speceyes-sandbox-<worker pid>-<random>``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from common.sandbox.cgroup import alive

log = logging.getLogger(__name__)

PREFIX = "speceyes-sandbox-"
DEVICES = {"null": (1, 3), "zero": (1, 5), "random": (1, 8), "urandom": (1, 9)}
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Workspace:
    """A session's folder: ``data`` and ``tmp`` for the sandbox to bind."""

    def __init__(self, *, uid: int, gid: int, disk_bytes: int, files: int) -> None:
        self.disk_bytes, self.files = disk_bytes, files
        self.root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        self.fs = self.root / "fs"
        self.fs.mkdir(mode=0o700)
        self.mounted = False
        try:
            if os.geteuid() == 0:
                options = f"size={disk_bytes},nr_inodes={files},mode=0700,uid={uid},gid={gid}"
                _mount_tmpfs(self.fs, options)
                self.mounted = True
            for name in ("data", "tmp"):
                (self.fs / name).mkdir(mode=0o700)
                if os.geteuid() == 0:
                    os.chown(self.fs / name, uid, gid)
            self.devices = self._devices()
        except BaseException:
            self.remove()
            raise

    def _devices(self) -> dict[str, str]:
        """The device nodes the sandbox shows, by name: nodes of its own where the worker
        may make them (so that what the code does to them, a timestamp, stays here), else
        the host's."""
        devices = {name: f"/dev/{name}" for name in DEVICES}
        if os.geteuid() != 0:
            return devices
        (self.root / "dev").mkdir(mode=0o755)
        for name, (major, minor) in DEVICES.items():
            node = self.root / "dev" / name
            with contextlib.suppress(OSError):
                os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
                os.chmod(node, 0o666)  # (past the umask)
                devices[name] = str(node)
        return devices

    @property
    def own_devices(self) -> bool:
        """Whether every device node the sandbox shows is the session's own."""
        return all(Path(node).parent == self.root / "dev" for node in self.devices.values())

    @property
    def data(self) -> Path:
        return self.fs / "data"

    @property
    def tmp(self) -> Path:
        return self.fs / "tmp"

    def over_budget(self) -> str | None:
        """Where nothing caps the folder while code runs (no tmpfs): why it is over its
        budget of bytes or files, or None. Counts without following links."""
        if self.mounted:
            return None
        used = 0
        for count, entry in enumerate(walk(self.fs), 1):
            used += entry.st_blocks * 512
            if used > self.disk_bytes or count > self.files:
                return (
                    f"the code's folder is over its budget of {self.disk_bytes >> 20} MiB "
                    f"and {self.files} files"
                )
        return None

    def remove(self) -> None:
        """Delete everything in the workspace and the workspace itself."""
        if self.mounted:
            _unmount(self.fs)
            self.mounted = False
        with contextlib.suppress(FileNotFoundError):
            remove_tree(self.root)


def walk(folder: Path) -> Iterator[os.stat_result]:
    """``lstat`` of everything below ``folder``, iteratively (any depth, no links)."""
    pending = [folder]
    while pending:
        current = pending.pop()
        try:
            entries = os.scandir(current)
        except OSError:
            continue
        with entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                yield info
                if stat.S_ISDIR(info.st_mode):
                    pending.append(Path(entry.path))


def remove_tree(folder: Path) -> None:
    """Delete ``folder`` and everything below it: one open directory at a time, by name
    relative to it (no path grows with the depth), links removed, never followed."""
    parent = os.open(folder.parent, _DIRECTORY)
    try:
        with contextlib.suppress(OSError):
            os.chmod(folder.name, 0o700, dir_fd=parent)
        top = os.open(folder.name, _DIRECTORY, dir_fd=parent)
    except BaseException:
        os.close(parent)
        raise
    names = [folder.name]  # the path from ``parent`` down to ``current``
    current = top
    try:
        while names:
            subfolder = _empty_files(current)
            if subfolder is not None:
                with contextlib.suppress(OSError):  # the code may have taken our rights away
                    os.chmod(subfolder, 0o700, dir_fd=current)
                below = os.open(subfolder, _DIRECTORY, dir_fd=current)
                os.close(current)
                current = below
                names.append(subfolder)
                continue
            up = os.open("..", _DIRECTORY, dir_fd=current) if len(names) > 1 else os.dup(parent)
            os.close(current)
            current = up
            os.rmdir(names.pop(), dir_fd=current)
    finally:
        os.close(current)
        os.close(parent)


def _empty_files(folder: int) -> str | None:
    """Remove every non-folder in the open folder; the name of a subfolder, if any.
    Reads the folder as a stream (it may hold hundreds of thousands of names), again
    until a pass removes nothing, since removing while reading may skip names."""
    removed = True
    while removed:
        removed = False
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    return entry.name
                os.unlink(entry.name, dir_fd=folder)
                removed = True
    return None


def sweep_stale() -> None:
    """Remove the workspaces of sessions whose worker is gone: folders of ours only (a
    real folder, not a link, owned by this uid, 0700), unmounted without following a
    link (anyone may plant names in /tmp)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        owner = folder.name[len(PREFIX) :].split("-", 1)[0]
        if not owner.isdigit() or alive(int(owner)) or not _ours(folder):
            continue
        with contextlib.suppress(OSError):
            fs = folder / "fs"
            if stat.S_ISDIR(fs.lstat().st_mode) and os.path.ismount(fs):
                _unmount(fs)
            remove_tree(folder)
            log.info("removed a stale sandbox folder %s", folder)


def _ours(folder: Path) -> bool:
    try:
        info = folder.lstat()
    except OSError:
        return False
    mode = info.st_mode
    return stat.S_ISDIR(mode) and info.st_uid == os.geteuid() and stat.S_IMODE(mode) == 0o700


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(target: Path, options: str) -> None:
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if _libc().mount(b"tmpfs", bytes(target), b"tmpfs", flags, options.encode()) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"cannot mount the sandbox's tmpfs: {os.strerror(error)}")


def _unmount(target: Path) -> None:
    if _libc().umount2(bytes(target), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
        log.warning("cannot unmount %s: %s", target, os.strerror(ctypes.get_errno()))
