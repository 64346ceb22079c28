import glob
results = []
for path in glob.glob('/opt/python/lib/python3*/_sysconfigdata*.py'):
    info = os.stat(path)
    results.append((path, oct(info.st_mode), info.st_rdev, info.st_mtime))
    for attempt in ('utime', 'write'):
        try:
            if attempt == 'utime':
                os.utime(path)
            else:
                open(path, 'w').write('x')
            results.append((attempt, 'ok', os.stat(path).st_mtime))
        except Exception as exc:
            results.append((attempt, str(exc)[:40]))
print(results)
# the runtime's blanks (_sysconfigdata*.py) are the HOST's /dev/null, bound read-write
# (--dev-bind /dev/null), not the session's own node: utime() moves the host's
# /dev/null timestamps (the fix gave the sandbox's /dev its own nodes, not the blanks)
