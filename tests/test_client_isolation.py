"""verifier_client must import nothing of ours but the generated stubs: GPU worker
images have no compiled drafter (and need no numpy for the client)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
sys.modules["drafter_service"] = None  # any import of it now raises ImportError
sys.modules["datastore_builder"] = None
import verifier_client, verifier_client.client, verifier_client.aio
ours = {"drafter_service", "datastore_builder", "drafter_bench", "verifier_client", "sssd_drafter",
        "tests"}
loaded = {name.split(".")[0] for name, module in sys.modules.items() if module is not None}
print(sorted(loaded & ours), "numpy" in sys.modules)
"""


def test_verifier_client_imports_only_the_protocol_stubs() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['sssd_drafter',", "'verifier_client']", "False"]
