import ctypes
import time

libc = ctypes.CDLL(None, use_errno=True)
timer = ctypes.c_void_p()
made = 0
for _ in range(300000):
    if libc.timer_create(1, None, ctypes.byref(timer)) != 0:
        break
    made += 1
errno = ctypes.get_errno()
time.sleep(2)
print("timers", made, "errno", errno)
# creates POSIX timers until the kernel refuses: each preallocates a queued signal,
# counted against RLIMIT_SIGPENDING of the uid, which every sandbox of every session on
# the machine shares (65533), and held for the rest of the wall clock
