import time

read = 0
start = time.monotonic()
for folder, subfolders, files in os.walk("/usr"):
    for name in files:
        try:
            with open(os.path.join(folder, name), "rb") as handle:
                while handle.read(1 << 20):
                    pass
            read += 1
        except Exception:
            pass
    if time.monotonic() - start > 1.5:
        break
print("files read", read)
# reads the host's files (/usr) into the page cache: the pages are charged to the
# session's memory group, which then cannot be freed when the session removes it (a
# dying group the kernel keeps until those pages are reclaimed)
