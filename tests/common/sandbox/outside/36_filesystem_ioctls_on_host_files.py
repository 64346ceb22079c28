import fcntl
import struct
fd = os.open('/usr/bin/env', os.O_RDONLY)
out = {}
for name, request, size in (('GETFSUUID', 0x80111500, 17), ('GETFSSYSFSPATH', 0x80811501, 129),
                            ('GETFLAGS', 0x80086601, 8), ('FIGETBSZ', 2, 4), ('FIBMAP', 1, 4)):
    try:
        out[name] = fcntl.ioctl(fd, request, b'\0' * size).rstrip(b'\0')[:40]
    except Exception as exc:
        out[name] = str(exc)[:40]
request = struct.pack('QQIIII', 0, 1 << 30, 0, 0, 4, 0) + b'\0' * (56 * 4)
try:
    out['FIEMAP'] = struct.unpack_from('QQQ', fcntl.ioctl(fd, 0xC020660B, request), 32)
except Exception as exc:
    out['FIEMAP'] = str(exc)[:40]
print(out)
# the ioctl rule refuses only TIOCSTI: every filesystem ioctl on the host's files works,
# naming the host's block device (ext4/vda), its filesystem UUID and where the file's
# blocks lie on the disk (FIEMAP physical offsets)
