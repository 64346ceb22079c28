import ctypes
import time
libc = ctypes.CDLL(None, use_errno=True)
info = (ctypes.c_ulong * 16)()
libc.sysinfo(info)
cpu = ctypes.c_uint()
libc.getcpu(ctypes.byref(cpu), None, None)
usr = os.statvfs('/usr')
print('uptime', info[0], 'loads', info[1:4], 'ram', info[4], 'free', info[5],
      'procs', info[10] & 0xffff, 'cpu', cpu.value, 'affinity', os.sched_getaffinity(0),
      'uname', os.uname(), 'boot', time.clock_gettime(7), '/usr blocks', usr.f_blocks,
      'free', usr.f_bfree, 'files', usr.f_files)
# what the allowed calls tell about the host: sysinfo (uptime, load, memory, the number of
# processes on the whole machine), uname, getcpu and affinity, CLOCK_BOOTTIME, statfs of
# the host's /usr filesystem
