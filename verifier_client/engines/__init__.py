"""Engine plug-ins: drafts from the drafting service inside vLLM and SGLang, no fork.

``batch`` is engine-agnostic; ``vllm`` and ``sglang`` adapt it to each engine's extension
points. Nothing here imports an engine until the engine loads the plug-in.
"""

from verifier_client.engines.batch import DrafterSettings, EngineDrafter

__all__ = ["DrafterSettings", "EngineDrafter"]
