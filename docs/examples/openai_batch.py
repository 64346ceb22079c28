"""Annotate the sample corpus through OpenAI's Batch API, with the official SDK.

Nothing here is SpecEyes': the SDK reads OPENAI_BASE_URL and OPENAI_API_KEY, so the
same script runs against OpenAI or against `speceyes serve`:

    OPENAI_BASE_URL=http://127.0.0.1:8000/openai/v1 OPENAI_API_KEY=$KEY \\
        python docs/examples/openai_batch.py samples/manifest.jsonl speceyes-deepeyes

It writes one request per manifest row (the image inline as a data: URL), uploads them,
makes a batch, waits for it, and prints each row's answer by its custom_id, then each
request that failed and why.
"""

import base64
import io
import json
import sys
import time
from pathlib import Path

from openai import OpenAI


def request(row: dict, folder: Path, model: str) -> dict:
    image = base64.b64encode((folder / row["image"]).read_bytes()).decode()
    text = row["question"]
    if row.get("options"):
        letters = "ABCDEFGH"
        text += "\n" + "\n".join(f"{letters[i]}. {o}" for i, o in enumerate(row["options"]))
    content = [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
    ]
    return {
        "custom_id": row["id"],
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": content}]},
    }


def main(manifest: str, model: str) -> None:
    folder = Path(manifest).parent
    rows = [json.loads(line) for line in Path(manifest).read_text().splitlines() if line]
    lines = "".join(json.dumps(request(row, folder, model)) + "\n" for row in rows)
    client = OpenAI()
    uploaded = client.files.create(
        file=("requests.jsonl", io.BytesIO(lines.encode())), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    print("batch", batch.id, batch.status)
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(2)
        batch = client.batches.retrieve(batch.id)
    counts = batch.request_counts
    print("batch", batch.status, f"{counts.completed} of {counts.total} answered")
    if batch.output_file_id:
        for line in client.files.content(batch.output_file_id).text.splitlines():
            answer = json.loads(line)
            message = answer["response"]["body"]["choices"][0]["message"]["content"]
            print("answer", answer["custom_id"], message)
    if batch.error_file_id:
        for line in client.files.content(batch.error_file_id).text.splitlines():
            failed = json.loads(line)
            print("failed", failed["custom_id"], failed["response"] or failed["error"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
