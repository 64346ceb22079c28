# third review (2026-12-03, after issue 42): the same, with a record no process can end with
global fcntl, struct
import fcntl, time, signal, struct
fcntl.fcntl(3, fcntl.F_SETFL, os.O_NONBLOCK)
n = 0
while n < 80:                                    # small reads: the host starts throttling
    os.write(2, b'.')
    time.sleep(0.002)
    n += 1
record = b'\n\x00speceyes-status 0000137f\n'
blob = b'x' * (65536 - len(record)) + record
while struct.unpack('i', fcntl.ioctl(3, 0x541B, b'\0\0\0\0'))[0]:
    pass
os.write(3, blob)
os.kill(os.getpid(), signal.SIGKILL)
