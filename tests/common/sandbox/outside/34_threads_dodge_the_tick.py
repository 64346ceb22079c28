global ctypes, time, spin
import ctypes
import threading
import time


def spin():
    libc = ctypes.CDLL(None)
    libc.prctl(29, 1, 0, 0, 0)
    tick = 4000000
    ts = (ctypes.c_long * 2)()
    clock = time.monotonic_ns
    while True:
        now = clock()
        boundary = (now // tick + 1) * tick
        while clock() < boundary - 250000:
            pass
        wake = boundary + 40000
        ts[0], ts[1] = wake // 1000000000, wake % 1000000000
        libc.clock_nanosleep(1, 1, ts, None)


for _ in range(8):
    threading.Thread(target=spin, daemon=True).start()
time.sleep(30)
# eight threads that compute between ticks and sleep across each: RLIMIT_CPU charges
# almost nothing, so only the group's quota (one core) and its exact count stop them;
# without a group (33) they run on every core until the wall clock
