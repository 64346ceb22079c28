import ctypes
import mmap
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mremap.restype = ctypes.c_void_p
fd = os.open('/dev/zero', os.O_RDWR)
size = 64 << 20
address = libc.mmap(None, size, 3, 1, fd, 0)
results = [libc.syscall(238, 2, ctypes.byref(ctypes.c_ulong(1)), 64), ctypes.get_errno()]
results += [libc.syscall(237, ctypes.c_void_p(address), size, 2, ctypes.byref(ctypes.c_ulong(2)), 64, 7), ctypes.get_errno()]
results += [libc.madvise(ctypes.c_void_p(address), size, 23), ctypes.get_errno()]
grown = libc.mremap(ctypes.c_void_p(address), ctypes.c_size_t(size), ctypes.c_size_t(3 << 29), 1)
results += [grown, ctypes.get_errno()]
for step in range(1, 25):
    libc.madvise(ctypes.c_void_p(grown), step << 26, 23)
print(results)
libc.munmap(ctypes.c_void_p(grown), ctypes.c_size_t(3 << 29))
shared = libc.mmap(None, ctypes.c_size_t(3 << 29), 3, 0x21, -1, 0)
for step in range(24):
    results.append(libc.madvise(ctypes.c_void_p(shared + (step << 26)), 1 << 26, 23))
print(results)
# a shared mapping of /dev/zero (shmem behind the host's /dev/zero node), NUMA policies
# and mbind with MPOL_MF_MOVE_ALL, MADV_POPULATE_WRITE, mremap past the object's end, then
# 1.5 GiB of shared anonymous memory populated by the kernel (MADV_POPULATE_WRITE, no
# page fault in Python): the memory group must stop it
