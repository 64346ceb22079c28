# third review (2026-12-03, after issue 42): the init's descriptors and memory through /proc (gVisor showed one)
out = []
for p in ['/proc/1/mem', '/proc/1/fd/0', '/proc/self/fd/0', '/proc/1/fd/1', '/proc/1/maps', '/proc/1/environ', '/proc/1/status']:
    for mode in ['rb', 'r+b', 'wb']:
        try:
            f = open(p, mode)
            out.append(f"{p} {mode} OK")
            f.close()
        except Exception as e:
            out.append(f"{p} {mode} {e.__class__.__name__} {e}")
print("\n".join(out))
