"""The lab: research code that the service path never imports.

- ``synth``: SpecEyes-Synth, a world small enough to learn on a CPU (``world``), the
  trainer of the tiny models (``train``) and their report (``report``);
- ``bench``: benchmark inputs and the embedded runner's benchmark;
- ``pipeline_bench``: the distributed pipeline end to end, with its own workers.

The command line reaches these through ``speceyes synth``, ``speceyes models
train-synth`` and ``speceyes bench``; ``common`` never imports them (a test checks).
"""
