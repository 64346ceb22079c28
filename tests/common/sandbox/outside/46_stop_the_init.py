# third review (2026-12-03, after issue 42): SIGSTOP to its init, which then notices nothing
import signal, time
r = os.kill(1, signal.SIGSTOP)
time.sleep(0.5)
print('alive after SIGSTOP to init', r)
