"""Evaluation: what the answers are worth, read from the store.

``calibration`` chooses the gate's threshold with a guarantee and replays recorded
logits; ``audit`` samples accepted answers against the agent; ``judge`` asks an LLM
judge as the reference does. All of it reads results; none of it submits or dispatches
work (the layer contract in pyproject.toml).
"""
