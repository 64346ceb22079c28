"""What comes in: images before they are decoded, corpora in and results out, what a
job's texts may hold."""

from __future__ import annotations

from common.config.base import Group, setting


class ImageSettings(Group):
    """Limits checked before an image is decoded (decompression bombs) and after."""

    max_bytes: int = setting(50 * 1024 * 1024, "Largest image file.", env="max_image_bytes", ge=1)
    max_pixels: int = setting(
        100_000_000,
        "Most pixels an image may declare (checked before it is decoded).",
        env="max_image_pixels",
        ge=1,
    )
    max_aspect_ratio: float = setting(
        200.0,
        "Longest side / shortest side (Qwen's smart resize refuses more).",
        env="max_image_aspect",
        gt=1.0,
    )
    exif_rotate: bool = setting(
        True,
        "Turn an image as its EXIF orientation says (right for photographs; recorded in "
        "the job key). The reference never does: the benchmark readers keep each image "
        "as the reference sees it, whatever this says.",
        env="exif_rotate",
    )


class SourceSettings(Group):
    """Corpora read by ``annotate`` (``common.sources.corpus``) and exported back."""

    copy_images: bool = setting(
        False,
        "Copy every image of a corpus into the upload store (api.upload_dir) as it is "
        "submitted, for sources the workers cannot reach. Off: a job refers to its image "
        "where it lies (a file, a tar member, a table row, a remote object).",
        env="copy_images",
        flag="--copy-images",
    )
    submit_rows: int = setting(
        5000,
        "Rows read, hashed and written to the store per transaction while submitting "
        "(memory holds one such chunk; its jobs are sent once it commits).",
        ge=1,
    )
    export_shard_rows: int = setting(
        100_000,
        "Rows per Parquet file when results go to a folder or prefix (--out DIR/).",
        flag="--shard-rows",
        ge=1,
    )


class RequestLimits(Group):
    """What one job's texts may hold (``common.limits`` checks them; API and CLI)."""

    max_question_chars: int = setting(2000, "Longest question.", ge=1)
    max_options: int = setting(
        26, "Most multiple-choice options (the letters run A-Z).", ge=2, le=26
    )
    max_option_chars: int = setting(1000, "Longest multiple-choice option.", ge=1)
    max_id_chars: int = setting(1000, "Longest row id, image path or known answer.", ge=1)
    max_name_chars: int = setting(200, "Longest batch name (the column's width).", ge=1, le=200)
