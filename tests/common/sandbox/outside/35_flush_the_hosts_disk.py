import time
fd = os.open('/usr/bin/env', os.O_RDONLY)
n = 0
start = time.monotonic()
while time.monotonic() - start < 1.5:
    os.fsync(fd)
    os.fdatasync(fd)
    n += 2
print('fsync/fdatasync of a read-only host file', n)
# fsync is allowed, and fsync of a clean file on ext4 still sends a cache FLUSH to the
# host's block device: ~20,000 a second from a read-only file under /usr (under gVisor
# too: the gofer passes it on), each one stalling the writes of the host's database and
# every other process on that disk
