"""Benchmark files as their publishers ship them, small: what the readers are tested on."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.helpers.images import png


def write_pope(path: Path, image: bytes | None = None) -> None:
    """A POPE parquet file of five rows (yes/no questions, images as PNG bytes, or all
    ``image``), in row groups of two."""
    records = [
        {
            "id": i,
            "question_id": f"q{i}",
            "question": f"Is there a thing {i}?",
            "answer": "yes" if i % 2 else "no",
            "image_source": f"img{i}",
            "category": "coco",
            "image": {"bytes": image or png((40, 30), (i, i, i)), "path": None},
        }
        for i in range(5)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=2)
