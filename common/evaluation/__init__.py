"""Evaluation: what the answers are worth, measured offline.

``calibration`` chooses the gate's threshold with a guarantee, from recorded logits it
replays; ``depth`` replays each speculation depth d <= D from one calibration run at D;
``judge`` asks an LLM judge about benchmark answers, as the reference does. It
reads the store and the gate; it never submits or dispatches work (a layer contract in
pyproject.toml). The online audit, which runs beside the work, is the pipeline's.
"""
