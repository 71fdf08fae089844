"""The console script's entry point (``analyzer.cli.app.run``): Arrow's allocator."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_POOL_OF_A_COMMAND = """
import sys
import analyzer.cli.app as app
assert "pyarrow" not in sys.modules  # as the console script runs it


def main():
    import pyarrow
    print(pyarrow.default_memory_pool().backend_name)


app.main = main
app.run()
"""


@pytest.mark.integration
@pytest.mark.parametrize("chosen, want", [(None, "system"), ("mimalloc", "mimalloc")],
                         ids=["default", "the user's"])
def test_a_command_allocates_arrow_memory_with_the_system_allocator(chosen, want):
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    out = subprocess.run([sys.executable, "-c", _POOL_OF_A_COMMAND], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == want
