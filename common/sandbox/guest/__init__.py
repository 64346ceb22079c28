"""Code that runs inside the sandbox, never in the service's process.

The folder is mounted read-only into every sandbox at ``/opt/speceyes``; its modules use
only the standard library and the image packages the sandbox is given, and import one
another by bare name (``python /opt/speceyes/harness.py``). The host imports ``pixels``
(one colour rule on both sides of the boundary) and, in tests, the others.
"""
