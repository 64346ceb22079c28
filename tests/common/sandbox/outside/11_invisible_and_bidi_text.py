import json

tricky = "\u202e\u2066\u200b\u200f\u2028\u2029\ufeff\U000e0041\ufff9\u061c\u180e\u00ad"
name = "/mnt/data/temp_processed_images/" + tricky + "gnp.png"
open(name, "wb").write(b"not an image")
os.write(
    3,
    json.dumps(
        {
            "images": [],
            "text": "approve" + tricky + "d",
            "printed": tricky,
            "error": None,
            "notes": [name, tricky * 20],
        }
    ).encode()
    + b"\n",
)
os._exit(0)
# Unicode format and separator characters (bidi overrides and isolates, zero-width and
# invisible characters, line/paragraph separators, BOM, tag characters) are not
# "control characters" to clean_text: they reach the text handed to the model, the
# step's printed output and notes, the store and the API unchanged
