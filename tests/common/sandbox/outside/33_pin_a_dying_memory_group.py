import random
path = '/usr/lib/x86_64-linux-gnu/libicudata.so.72.1'
if not os.path.exists(path):
    path = '/usr/lib/python3.11/pydoc_data/topics.py'
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
length = min(1 << 20, size)
offset = random.randrange(0, max(1, size - length)) & ~4095
os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
print('pinned', len(os.pread(fd, length, offset)), 'bytes at', offset)
# evicts a range of a host file from the page cache, then reads it back: those pages are
# charged to this session's memory group, which therefore outlives the session as a
# dying group (until reclaim). Each session can leave one: after ~65,535 the kernel's
# memory cgroup ids are spent, mkdir of the next session's group fails, and
# SessionGroup.create falls back to NO control group (a warning): memory, tasks and CPU
# then have per-process limits only (several cores, tick-sampled CPU)
