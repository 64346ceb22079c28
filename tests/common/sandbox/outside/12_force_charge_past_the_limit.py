import mmap
import signal
import time
block = mmap.mmap(-1, 470 << 20)
for offset in range(0, 470 << 20, 4096):
    block[offset] = 1
stat = os.stat
prefix = '/usr/lib/' + os.urandom(6).hex() + '%x'
start = time.monotonic()
made = 0
while time.monotonic() - start < 1.1:
    for i in range(1000):
        try:
            stat(prefix % (made + i))
        except Exception:
            pass
    made += 1000
signal.pthread_sigmask(signal.SIG_BLOCK, list(range(34, 65)))
me = os.getpid()
for _ in range(3200):
    for number in range(34, 65):
        os.kill(me, number)
print('lookups', made, 'pending', len(signal.sigpending()))
# fills its memory group to the limit with what reclaim can take back (negative dentries
# on the host's /usr), then queues real-time signals, whose entries the kernel allocates
# GFP_ATOMIC (charged by force past a group's limit on some kernels): the group's peak
# must stay within its limit
