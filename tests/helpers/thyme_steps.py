"""What a scripted Thyme model writes as its steps: code that crops, counts, raises,
loops forever, and a final answer."""

from __future__ import annotations

CROP = """<think>look closer</think><code>
```python
from PIL import Image
image = Image.open(image_path)
x1, y1, x2, y2 = 10, 10, 20, 20
processed_path = "/mnt/data/temp_processed_images/crop_1.png"
image.crop((x1, y1, x2, y2)).save(processed_path)
print(processed_path)
```
</code>"""
COUNT = (
    "<code>\n```python\nwidth, height = Image.open(image_path).size\n"
    "print(width * height)\n```\n</code>"
)
RAISES = "<code>\n```python\nraise ValueError('nope')\n```\n</code>"
LOOPS = "<code>\n```python\nx = 0\nwhile True:\n    x += 1\n```\n</code>"
ANSWER = "<think>done</think><answer>B</answer>"
