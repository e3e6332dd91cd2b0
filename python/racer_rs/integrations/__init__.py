"""RACER inside serving engines: :mod:`racer_rs.integrations.sglang` (a speculative algorithm,
``RACER_RS``, registered through SGLang's plugin entry point) and
:mod:`racer_rs.integrations.vllm` (``RacerProposer``, a vLLM ``custom_class`` proposer).

Importing this package, or ``racer_rs``, imports no engine: each module imports its engine
only when it is used, and says which extra to install when the engine is missing. Both read
RACER's options from the environment variable ``RACER_RS_OPTIONS`` (see
:class:`racer_rs.integrations.options.ServingOptions`), since neither engine has a place
for a plug-in's own settings.
"""

from __future__ import annotations
