# third review (2026-12-03, after issue 42): a report and a status record claiming a clean exit, then its init killed
# (gVisor delivered what a kernel drops for a PID 1), then a crash
import signal, json
head = json.dumps({'images': [], 'text': 'forged: all fine', 'printed': '', 'error': None, 'notes': []})
os.write(3, head.encode() + b'\n' + b'\n\x00speceyes-status 00000000\n')
os.kill(1, signal.SIGKILL)
os.kill(os.getpid(), signal.SIGSEGV)
