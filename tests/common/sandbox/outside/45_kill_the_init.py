# third review (2026-12-03, after issue 42): SIGKILL to its init
import signal, time
r = os.kill(1, signal.SIGKILL)
time.sleep(0.5)
print('alive after SIGKILL to init', r)
