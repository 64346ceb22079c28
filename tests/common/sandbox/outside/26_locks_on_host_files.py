import fcntl
import time
held = []
results = []
for path in ('/usr/bin/env', '/usr/lib/os-release', '/opt/speceyes/harness.py',
             '/opt/site/PIL/__init__.py', '/dev/null'):
    try:
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.append(fd)
        results.append((path, 'flock'))
    except Exception as exc:
        results.append((path, str(exc)[:50]))
print(results)
time.sleep(2.5)
# exclusive flock()s on the host's own files that the read-only binds show (/usr, the
# harness, the packages in /opt/site, the host's /dev/null): the locks are on the host's
# inodes, so a host process that flocks one of them waits while the code holds it
