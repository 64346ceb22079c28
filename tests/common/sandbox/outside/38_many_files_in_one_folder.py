import time
os.makedirs('/mnt/data/d', exist_ok=True)
os.chdir('/mnt/data/d')
create, close = os.open, os.close
flags = os.O_CREAT | os.O_WRONLY
n = 0
error = ''
start = time.monotonic()
try:
    while time.monotonic() - start < 2.2:
        for i in range(1000):
            close(create('%x' % (n + i), flags))
        n += 1000
except Exception as exc:
    error = str(exc)[:50]
print('files', n, error)
# as many empty files as the wall clock allows in one folder: where the worker is not
# root (host disk, no inode cap while it runs) ~40,000 a second, which the worker then
# lists whole (list(os.scandir)) in over_budget and in remove_tree and unlinks one by
# one: its memory and CPU grow with what the code made, past its stated bound
