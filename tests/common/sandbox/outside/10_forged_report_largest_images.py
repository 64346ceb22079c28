import json

sizes = [(1413, 707), (1413, 707), (1413, 707), (1413, 707)]
header = {"images": [], "text": None, "printed": "", "error": None, "notes": []}
for width, height in sizes:
    header["images"].append({"width": width, "height": height})
os.write(3, json.dumps(header).encode() + b"\n")
for width, height in sizes:
    data = os.urandom(3 * width * height)
    sent = 0
    while sent < len(data):
        sent += os.write(3, data[sent : sent + 65536])
os._exit(0)
# a report forged on the result channel with the most images and pixels the host takes
# (4 x 1413x707 of noise, just under 4,000,000 pixels), sizes that the model's grid rounds
# up: the worker decodes, hashes, resizes and thumbnails every one
