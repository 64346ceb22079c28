"""The pipeline: how a job goes from submitted to answered.

``submit`` turns rows into stored jobs; ``dispatch`` hands them to a queue (Celery) or
keeps them in the store (embedded); ``runner`` drives the embedded pool, the workers
drive the same ``work`` units; ``funnel`` is the method's stages (screen, speculate,
``gate``, agent); ``audit`` re-runs a sample of accepted answers through the agent and
raises the alarm on drift; ``reconcile`` finds jobs a dead worker stranded. A new stage
or method goes in ``funnel``; a new way of moving jobs is a ``Dispatcher``.
"""
