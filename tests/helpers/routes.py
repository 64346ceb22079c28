"""A scripted corpus with every route through the funnel, for the runners' tests."""

from __future__ import annotations

from common.backends.scripted import JobScript

# item (file name) -> what the scripted model does for it
ROUTES = {
    "img000.png": JobScript(needs_tools=True, agent_answer="T0"),
    "img001.png": JobScript(needs_tools=True, agent_answer="T1"),
    "img002.png": JobScript(needs_tools=True, agent_answer="T2"),
    "img003.png": JobScript(answer="S3", confidence=0.999),
    "img004.png": JobScript(answer="S4", confidence=0.999),
    "img005.png": JobScript(answer="S5", confidence=0.995),
    "img006.png": JobScript(answer="S6", confidence=0.99),
    "img007.png": JobScript(answer="x", confidence=0.7, agent_answer="U7"),
    "img008.png": JobScript(answer="x", confidence=0.9, agent_answer="U8"),
    "img009.png": JobScript(needs_tools=True, agent_steps=("<think>no idea</think>",)),
}
