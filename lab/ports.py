"""Ports for the servers a test or a bench starts in a subprocess: the one helper the
lab, the tests and the docs' screenshots share."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def reserved_port() -> Iterator[int]:
    """A port for a server this test starts, kept from every other process while the
    block runs: a port merely found free is handed to the next asker too (the parallel
    test workers start servers of their own), and a server that takes seconds to import
    loses it. The port is held bound but not listening, with SO_REUSEADDR, which lets a
    server that sets it too (uvicorn, ``speceyes serve``) bind and listen on it."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        yield int(holder.getsockname()[1])


def free_port() -> int:
    """A port free now, for a server started at once by a process that is the only one
    asking (a bench, a script): ``reserved_port`` where others may ask too."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
