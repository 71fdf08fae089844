"""`python -m analyzer ...`."""

from analyzer.cli import main

main()
