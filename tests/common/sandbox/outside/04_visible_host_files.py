import os

found = {}
for top in ("/usr/local", "/opt", "/dev", "/", "/usr/lib/python3", "/usr/share/doc"):
    count = 0
    names = []
    for folder, subfolders, files in os.walk(top):
        count += len(files)
        if folder.count("/") <= 4:
            names.append(folder)
        if count > 20000:
            break
    found[top] = (count, names[:12])
print(found)
print(os.listdir("/dev"), os.listdir("/"))
# inventories what of the host the guest can read: all of /usr (so /usr/local and its
# site-packages, where the python:3.11-slim image installs the project and its
# dependencies), the masked runtime, /dev; only names and counts are printed
