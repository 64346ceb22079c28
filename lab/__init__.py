"""The lab: research code that the service path never imports.

- ``synth``: SpecEyes-Synth, a world small enough to learn on a CPU (``world``), the
  trainer of the tiny models (``train``) and their report (``report``);
- ``bench``: every benchmark of ``speceyes bench`` (the fast stage, the agent, the
  sandbox, the embedded runner, the distributed pipeline) and its inputs.

The command line reaches these through ``speceyes synth``, ``speceyes models
train-synth`` and ``speceyes bench``; ``common`` never imports them (a test checks).
"""
