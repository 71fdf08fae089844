"""`python -m tracer ...` (also what `torchrun -m tracer record ...` runs)."""

from tracer.cli import main

if __name__ == "__main__":
    main()
