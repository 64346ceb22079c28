held = []
written = 0
for i in range(60):
    try:
        fd = os.open('/mnt/data', os.O_TMPFILE | os.O_RDWR, 0o600)
    except Exception as exc:
        print('open', exc)
        break
    held.append(fd)
    try:
        os.posix_fallocate(fd, 0, 8 << 20)
        written += 8
    except Exception as exc:
        print('fallocate', i, exc)
        break
print('unnamed files', len(held), 'MiB', written, os.statvfs('/mnt/data').f_bfree)
# fills the tmpfs with unnamed O_TMPFILE files (no name anywhere, so no walk of the
# folder sees them) held open: the tmpfs's size cap and the memory group still count them
