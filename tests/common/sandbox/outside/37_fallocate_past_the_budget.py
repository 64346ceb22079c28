import time
start = time.monotonic()
total = 0
error = ''
try:
    for i in range(64):
        fd = os.open('/mnt/data/big%d' % i, os.O_CREAT | os.O_WRONLY)
        os.posix_fallocate(fd, 0, 64 << 20)
        os.close(fd)
        total += 64
except Exception as exc:
    error = str(exc)[:60]
print('MiB allocated', total, 'in s', round(time.monotonic() - start, 3), error)
# allocates up to 4 GiB with fallocate (stops there on purpose): on the tmpfs it meets
# the size cap; where the worker is not root the folder is the host's disk, counted only
# after the execution, and fallocate writes no byte: 4 GiB in milliseconds, so the wall
# clock is no bound on how much of the host's disk one execution takes
