import ctypes
import threading
import time
libc = ctypes.CDLL(None)
worker = threading.Thread(target=time.sleep, args=(60,))
worker.start()
libc.syscall(60, 0)
# the main thread (PID 1 of the namespace) ends alone with SYS_exit while another thread
# sleeps on: the process lives on as a zombie leader, which neither bubblewrap's wait nor
# the worker's sees end; the worker must stop it on the wall clock and reap everything
