"""The one settings object, composed of groups: each group is the view a component takes.

``Settings`` holds one group per part of the service, the way vLLM composes its
``VllmConfig``::

    Settings
    ├── models     the two models (large, small), the backend that runs them, its server
    ├── funnel     phases I-III: who screens, batch sizes, baseline and calibration runs
    ├── gate       phase III: the answer-separability gate
    ├── agent      phase IV: the agent loop, and (Thyme) its code sandbox
    ├── images     what an image may be before it is decoded
    ├── requests   what a job's texts may hold (API and command line)
    ├── broker     the distributed pipeline's queues
    ├── recovery   retries, heartbeats, the reconciler, the stall watchdog
    ├── api        ``speceyes serve``
    ├── audit      the online audit
    ├── judge      the LLM judge for benchmark answers
    ├── webhooks   events sent to callers' URLs: retries, time limits, allowed hosts
    ├── accounting what model time costs (a price per GPU-hour, for usage in money)
    └── database_url

Each field is written once, with its default, its checks and its description; from
there come its environment variable (``SPECEYES_`` and a flat name, the same names the
service always read: ``SPECEYES_GATE_THRESHOLD`` sets ``gate.threshold``), its
command-line flag where it has one (``cli.options``), and its row in
``docs/configuration.md`` (``configuration_markdown``; a test fails when the file is
stale). Values come from keyword arguments, then the environment, then a ``.env``
file, then the defaults. Nothing else in the code reads the environment.

The flat name of a field is its group's prefix and its own name (``gate_`` +
``threshold``), unless the field names it (``env``); a group's fields share a prefix
given where the group is placed (``env_prefix``), so the two models' fields read
``SPECEYES_LARGE_MODEL``, ``SPECEYES_SMALL_SERVER_URL``. What a calibration file says
of the audit, and the scripted backend's knobs for tests, are not settings.

One module per group (``models``, ``method``, ``agent``, ``inputs``, ``service``,
``accounting``), how a
setting is written (``base``), the environment and flags read by flat name
(``environment``), the whole composed (``settings``), and the calibration file a setting
may point to (``calibration``). What the rest of the code imports is named here.
"""

from common.config.accounting import AccountingSettings
from common.config.agent import AgentSettings, SandboxSettings
from common.config.base import AgentKind, BackendKind, GateMode, Isolation, Method, Role, Screener
from common.config.environment import Leaf
from common.config.inputs import ImageSettings, RequestLimits, SourceSettings
from common.config.method import AuditSettings, FunnelSettings, GateSettings, JudgeSettings
from common.config.models import DEFAULT_MODELS, ModelSettings, ModelsSettings
from common.config.service import ApiSettings, BrokerSettings, RecoverySettings, WebhookSettings
from common.config.settings import (
    Settings,
    configuration_markdown,
    default_of,
    flat_paths,
    leaves,
    without_password,
)

__all__ = [
    "DEFAULT_MODELS",
    "AccountingSettings",
    "AgentKind",
    "AgentSettings",
    "ApiSettings",
    "AuditSettings",
    "BackendKind",
    "BrokerSettings",
    "FunnelSettings",
    "GateMode",
    "GateSettings",
    "ImageSettings",
    "Isolation",
    "JudgeSettings",
    "Leaf",
    "Method",
    "ModelSettings",
    "ModelsSettings",
    "RecoverySettings",
    "RequestLimits",
    "Role",
    "SandboxSettings",
    "Screener",
    "Settings",
    "SourceSettings",
    "WebhookSettings",
    "configuration_markdown",
    "default_of",
    "flat_paths",
    "leaves",
    "without_password",
]
