# third review (2026-12-03, after issue 42): a header of ~1 MiB of empty objects (about 25
# times that once parsed), the largest views a trajectory may be shown, 1 MiB of stderr
import json
img = {'width': 3584, 'height': 3584, 'source_width': 3584, 'source_height': 3584}
base = {'images': [img, img], 'text': None, 'printed': '', 'error': None, 'notes': [], 'x': []}
empty = json.dumps(base)
room = (1 << 20) - len(empty) - 96
head = empty[:-3] + '[' + '{},' * (room // 3) + '{}]}'
os.write(2, b'e' * ((1 << 20) - 64))
os.write(3, head.encode() + b'\n')
row = b'\x07' * (3 * 3584 * 3584)
os.write(3, row)
os.write(3, row)
os._exit(0)
