import ctypes
libc = ctypes.CDLL(None, use_errno=True)
results = []
open('/mnt/data/x', 'w').write('x')
for old, new, flags in (('/mnt/data', '/tmp', 2), ('/mnt/data/x', '/tmp/x', 0),
                        ('/mnt/data/x', '/mnt/data/y', 4), ('/mnt/data/image.jpg', '/mnt/data/x', 2),
                        ('/mnt/data', '/mnt/elsewhere', 0), ('/tmp', '/mnt/data/t', 0)):
    results.append(libc.renameat2(-100, old.encode(), -100, new.encode(), flags))
    results.append(ctypes.get_errno())
info = os.lstat('/mnt/data/x')
print(results, sorted(os.listdir('/mnt/data')), oct(info.st_mode), info.st_rdev)
# renameat2 with RENAME_EXCHANGE of its two mount points, across them, RENAME_WHITEOUT
# (which leaves a 0:0 character device where the old name was: the one device node an
# unprivileged process may make, harmless on a nodev tmpfs), the input image swapped for
# another file, the mount points moved away: only renames inside one folder may work
