"""Mutation testing of the promise-carrying modules (``make mutate``; docs/testing.md):
``promises`` ties each documented guarantee to the change that breaks it, ``modules``
runs cosmic-ray over the modules, ``equivalent`` lists the survivors that cannot die."""
