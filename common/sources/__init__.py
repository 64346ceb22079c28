"""Sources: where images and their rows come from, before any job exists.

A folder, a CSV or JSONL file, a WebDataset's shards, a Hugging Face dataset or one of
the paper's benchmarks becomes a stream of ``SourceRow`` (``corpus``); ``locations``
reads an image from wherever it lives (a path, a URL, a member of a tar), ``fields``
picks a row's question and options. Nothing here knows of jobs, queues or models: a new
kind of source is a module here and a case in ``corpus.rows``.
"""
