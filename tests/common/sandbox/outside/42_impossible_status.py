# third review (2026-12-03, after issue 42): a record no wait status can be, then its init killed: the worker raised
import signal
os.write(3, b'\n\x00speceyes-status 0000137f\n')
os.kill(1, signal.SIGKILL)
