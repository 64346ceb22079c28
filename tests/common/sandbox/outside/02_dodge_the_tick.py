import ctypes
import time

libc = ctypes.CDLL(None)
libc.prctl(29, 1, 0, 0, 0)
tick = 4000000
ts = (ctypes.c_long * 2)()
spins = 0
clock = time.monotonic_ns
for fd in (0, 1, 2, 3):
    os.close(fd)
while True:
    now = clock()
    boundary = (now // tick + 1) * tick
    while clock() < boundary - 250000:
        spins += 1
    wake = boundary + 40000
    ts[0], ts[1] = wake // 1000000000, wake % 1000000000
    libc.clock_nanosleep(1, 1, ts, None)
# RLIMIT_CPU is enforced on tick-sampled time (CONFIG_TICK_CPU_ACCOUNTING, HZ=250): the
# code computes between ticks and sleeps across each one (absolute clock_nanosleep, timer
# slack 1 ns), so it could run ~90% of a core for the whole wall clock and never be
# charged; it also closes its own ends of the pipes first, so that only the control
# group's exact count can stop it
