import ctypes
import time
libc = ctypes.CDLL(None, use_errno=True)
results = []
for option, argument in ((15, b'\x1b]0;pwned\x07\x1b[2J'), (36, 1), (4, 1), (29, 1),
                         (22, 1), (35, 0), (0x59616d61, 0), (38, 1), (57, 1)):
    value = ctypes.c_char_p(argument) if not isinstance(argument, int) else argument
    results.append((option, libc.prctl(option, value, 0, 0, 0), ctypes.get_errno()))
anon = ctypes.c_char_p(b'\x1b[31mevil')
results.append(('vma', libc.prctl(0x53564d41, 0, 0, 4096, anon), ctypes.get_errno()))
results.append(('mm', libc.prctl(35, 8, 0, 0, 0), ctypes.get_errno()))
print(results)
time.sleep(2)
# prctl is allowed but for PR_SET_PDEATHSIG: a comm name made of terminal escapes (what
# ps, top and the janitor's /proc/*/status show on the host), PR_SET_CHILD_SUBREAPER,
# dumpable, timer slack, PR_SET_SECCOMP strict, PR_SET_MM, PR_SET_PTRACER, no_new_privs
# again, PR_SET_IO_FLUSHER, an anonymous VMA name with escapes
