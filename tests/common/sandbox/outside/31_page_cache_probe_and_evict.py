import builtins
path = '/usr/lib/python3.11/pydoc_data/topics.py'
if not os.path.exists(path):
    path = '/usr/bin/bwrap'
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
buf = builtins.bytearray(4096)
counts = []
for phase in range(2):
    n = 0
    for off in range(0, size, 4096):
        try:
            os.preadv(fd, [buf], off, os.RWF_NOWAIT)
            n += 1
        except builtins.OSError:
            pass
    counts.append(n)
    if phase == 0:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
print(path, 'pages', size // 4096, 'in the host page cache before / after DONTNEED', counts)
# preadv2(RWF_NOWAIT) answers EAGAIN for a page that is not in the page cache: the code
# sees which of the host's files (any under /usr, /opt) the host or other sessions read
# lately, page by page (mincore is closed to this, preadv2 is not); fadvise(DONTNEED)
# on a file opened read-only evicts the host's cached pages of it (Flush+Reload on the
# page cache, across sessions; and re-reads forced on the host)
