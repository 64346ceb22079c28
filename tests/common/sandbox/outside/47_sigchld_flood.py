# third review (2026-12-03, after issue 42): flood the init with SIGCHLD from 8 threads, then exit 137
global signal, threading, time, flood
import signal, threading, time
def flood():
    end = time.time() + 1.5
    while time.time() < end:
        os.kill(1, signal.SIGCHLD)
ts = [threading.Thread(target=flood) for _ in range(8)]
for t in ts: t.start()
for t in ts: t.join()
os._exit(137)
