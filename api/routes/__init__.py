"""The API's routes, one module per resource: ``jobs``, ``batches``, ``health``."""
