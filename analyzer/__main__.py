"""`python -m analyzer ...`."""

from analyzer.cli import run

run()
