"""paritytrace recorder. ``tracer.ModelSpec`` (tracer/modelspec.py) is its public API for
``tracer record --model``; it is imported on first use, so ``tracer --help`` does not load torch."""


def __getattr__(name: str):
    if name in ("ModelSpec", "split_module_list"):
        from tracer import modelspec

        return getattr(modelspec, name)
    raise AttributeError(f"module 'tracer' has no attribute {name!r}")
