import json
budget = (1 << 18) - 200
header = '{"images": [], "text": null, "printed": "", "error": null, "notes": [], "x": [' + '{},' * (budget // 3) + '{}]}'
os.write(3, header.encode() + b'\n')
os._exit(0)
# a report line just under the header cap made of empty objects: 3 bytes of JSON each
# become a 64-byte dict (about 20 times its size) in the worker's json.loads
