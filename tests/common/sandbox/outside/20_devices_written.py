import glob
results = []
for path in ['/dev/null', '/dev/urandom', '/dev/random', '/dev/zero'] + glob.glob('/opt/python/lib/python3*/_sysconfigdata*'):
    for attempt in ('utime', 'write', 'chmod', 'truncate'):
        try:
            if attempt == 'utime':
                os.utime(path)
            elif attempt == 'write':
                with open(path, 'wb') as handle:
                    handle.write(b'x' * 4096)
            elif attempt == 'chmod':
                os.chmod(path, 0o777)
            else:
                os.truncate(path, 0)
            results.append((path, attempt, 'ok'))
        except Exception as exc:
            results.append((path, attempt, str(exc)[:40]))
for path in ('/dev/newnode', '/opt/evil', '/usr/evil', '/mnt/evil', '/evil'):
    try:
        open(path, 'w').write('x')
        results.append((path, 'created'))
    except Exception as exc:
        results.append((path, str(exc)[:40]))
print(results)
# the device nodes are the host's own, bound read-write: utime on them changes the host's
# /dev/null's timestamps, writes to /dev/urandom mix into the host's pool; the blanked
# _sysconfigdata files are /dev/null too; nothing else may be created or changed
