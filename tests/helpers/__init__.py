"""What tests share, one module a topic; a test imports these, never another test file.

- ``waiting``: ``wait_until``, the one way to wait for work (poll with a deadline);
- ``images``: PNG bytes and folders of distinct images;
- ``services``: where the suite's PostgreSQL and Redis are;
- ``store``: a batch and items for the job store;
- ``routes``: a scripted corpus with every route through the funnel;
- ``models``: ``ForceText``, making a tiny model write a chosen text;
- ``standin_server``: an OpenAI-compatible server in front of the tiny models;
- ``api``: an app over a fresh database, with a key, and its requests;
- ``workers``: ``speceyes worker`` as a subprocess;
- ``faults``: PostgreSQL and Redis of our own to stop and start, and a run to follow;
- ``benchmarks``: benchmark files in their publishers' formats, small;
- ``sandbox``: the code sandbox's test limits, leftover checks and hostile runs;
- ``hostile_programs``: the corpus of hostile programs, by class of attack;
- ``thyme_steps``: what a scripted Thyme model writes;
- ``browser``: a headless Chromium through Playwright, and the errors its pages report.
"""
