"""The chat templates are model-facing data: written with their repeated blocks folded,
they must still be the published text to the character."""

from __future__ import annotations

import hashlib

import pytest

from common.models.chat_templates import QWEN2_5_VL, QWEN3_VL

# sha256 of each ``chat_template.json`` template as published (and as this file held it
# before its blocks were folded)
PUBLISHED = {
    "QWEN2_5_VL": "a0bc6f6fc7a29a80017a433e8f03a1cc1236e838a944a2d034295a60c4f2fddb",
    "QWEN3_VL": "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4",
}


@pytest.mark.parametrize(("name", "template"), [("QWEN2_5_VL", QWEN2_5_VL), ("QWEN3_VL", QWEN3_VL)])
def test_each_template_is_the_published_text(name, template):
    assert hashlib.sha256(template.encode()).hexdigest() == PUBLISHED[name]
