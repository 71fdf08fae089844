"""`python -m tracer ...` (also what `torchrun -m tracer record ...` runs)."""

from tracer.cli import main

main()
