import signal
import time

signal.pthread_sigmask(signal.SIG_BLOCK, list(range(34, 65)))
queued = 0
error = ""
me = os.getpid()
kill = os.kill
start = time.monotonic()
try:
    while time.monotonic() - start < 1.2:
        for number in range(34, 65):
            kill(me, number)
        queued += 31
except Exception as exc:
    error = str(exc)
print("queued", queued, error, len(signal.sigpending()))
# queues real-time signals to itself (blocked, so they stay pending) until the per-uid
# RLIMIT_SIGPENDING is reached (65533 is shared by every sandbox of the machine), the
# sigqueue entries charged to its group
