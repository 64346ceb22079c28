# third review (2026-12-03, after issue 42): an exit that would read as a signal of its choosing (SIGSYS)
import signal
os.write(3, b'\n\x00speceyes-status 0000001f\n')
os.kill(1, signal.SIGKILL)
