"""Decode-side client of the drafting service (tree packing and verification: issue 5).

Imports nothing of this repository but the generated protocol stubs (``sssd``),
so GPU worker images need no compiled drafter::

    client = DrafterClient("drafter:50051", deadline_ms=3.0)
    client.wait_ready()
    client.add_request("r1", prompt_ids)
    result = client.step({"r1": [first_token]})   # once per decode step
    tree = result["r1"]                           # Tree(tokens, parents, scores) or None
    client.finish("r1")                           # stored in the background

``ReplicaSetClient(["d0:50051", "d1:50051"])`` (or one headless Service name) drafts
each request on one of several replicas, by rendezvous hashing of its id.
"""

from verifier_client.aio import AioDrafterClient
from verifier_client.breaker import BreakerConfig, BreakerState
from verifier_client.budget import PROFILES, BudgetRule, GpuProfile
from verifier_client.channel import DrafterUnreachable
from verifier_client.client import DrafterClient
from verifier_client.replica_set import ReplicaSetClient
from verifier_client.results import ClientStats, Outcome, StepResult, Tree

__all__ = [
    "PROFILES",
    "AioDrafterClient",
    "BreakerConfig",
    "BreakerState",
    "BudgetRule",
    "ClientStats",
    "DrafterClient",
    "DrafterUnreachable",
    "GpuProfile",
    "Outcome",
    "ReplicaSetClient",
    "StepResult",
    "Tree",
]
