"""`python -m analyzer ...`."""

from analyzer.cli.app import run

run()
