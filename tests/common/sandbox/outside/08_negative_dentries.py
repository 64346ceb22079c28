import time

stat = os.stat
made = 0
start = time.monotonic()
while time.monotonic() - start < 1.6:
    for i in range(2000):
        try:
            stat("/usr/lib/n%x" % (made + i))
        except Exception:
            pass
    made += 2000
print("lookups", made)
# fills the kernel's dentry cache with negative entries for names on the host's own
# filesystem (/usr, read-only but shared): they are charged to the session's group while
# it lives, and stay in the host's cache after the session is gone
