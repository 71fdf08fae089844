"""``tracer record --model SPEC``: the ``ModelSpec`` a SPEC names, checked before any worker.

SPEC forms (``load_spec``):

- ``reference`` (default): the reference transformer of tracer/model.py (``--hidden``,
  ``--layers``, ``--seq``), FSDP units from ``size_based_auto_wrap_policy``.
- ``package.module:factory``: ``factory`` imported from an importable module.
- ``path/to/file.py:factory``: ``factory`` from the user's own file (importlib, from its path).
- ``hf:gpt2``, ``hf:llama``: tiny transformers models built offline (tracer/hf.py);
  ``hf:gpt2?n_layer=4,n_embd=128`` sets those keys of its config (checked against it).

The form is read without torch first (tracer/specform.py): the CLI refuses a SPEC that names
no model (a missing file, say) before torch is imported.

A factory takes no arguments and returns a ``ModelSpec`` (tracer/modelspec.py).
``torch.manual_seed(--seed)`` is set just before it is called, so a factory that draws its
weights from torch's global generator is deterministic without seeding itself. The baseline
process and every rank call it (they are separate processes); the ranks then load the
baseline's initial parameters by FQN, so only its structure and buffers have to come out the
same in each process.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from tracer import hf, specform
from tracer.modelspec import ModelSpec, SpecError, split_module_list

REFERENCE = specform.REFERENCE
HF_PREFIX = specform.HF_PREFIX
HF_FAMILIES = specform.HF_FAMILIES


def _bad(spec: str, problem: str, fix: str) -> SpecError:
    return specform.bad_spec(spec, problem, fix)


def _factory(spec: str) -> Callable[[], Any]:
    """The factory named by ``spec`` (not ``reference``; its form read by
    ``specform.parse_spec``). Raises ``SpecError``."""
    form = specform.parse_spec(spec)
    if form.kind == "hf":  # the factories of tracer/hf.py, by name, with the config's overrides
        return functools.partial(getattr(hf, form.where), overrides=dict(form.overrides), spec=spec)
    where, attr = form.where, form.factory
    if form.kind == "file":
        path = Path(where).expanduser()
        name = f"_paritytrace_spec_{abs(hash(str(path.resolve())))}"
        loader = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        try:
            loader.loader.exec_module(module)
        except Exception as exc:  # the user's code: any error there is theirs to fix
            sys.modules.pop(name, None)
            raise _bad(spec, f"importing {path} raised {type(exc).__name__}: {_first_line(exc)}",
                       "fix that file") from None
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as exc:
            raise _bad(spec, f"no module {exc.name!r}",
                       "install it or pass path/to/file.py:factory") from None
        except Exception as exc:
            raise _bad(spec, f"importing {where} raised {type(exc).__name__}: {_first_line(exc)}",
                       "fix that module") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise _bad(spec, f"{where} has no function {attr!r}", "name a function that returns a ModelSpec")
    return factory


def _exited(spec: str, where: str, exc: SystemExit) -> SpecError:
    return _bad(spec, f"{where} exited with status {exc.code} (sys.exit)",
                "never end the process from model code: raise an exception instead")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def load_spec(cfg) -> ModelSpec:
    """The ``ModelSpec`` of ``cfg.model`` (a ``RecordConfig``), with ``--wrap-min-params``
    applied. Raises ``SpecError`` (one line) for a bad spec, a factory that raises or returns
    something else, or a model with dropout or a submodule named like a wrapper."""
    spec = cfg.model
    if spec == REFERENCE:
        from tracer import model as reference

        return ModelSpec(
            model=reference.build_model(cfg.hidden, cfg.layers, cfg.seed),
            make_batch=lambda b, seed: reference.make_batch(b, cfg.seq, cfg.hidden, seed),
            loss=reference.loss_fn, units=(), wrap_min_params=cfg.auto_wrap_min_params,
            tp_plan=reference.tp_plan, pp_split=split_module_list("layers"))
    factory = _factory(spec)
    torch.manual_seed(cfg.seed)
    try:
        built = factory()
    except SpecError:
        raise
    except SystemExit as exc:
        raise _exited(spec, "the factory", exc) from None
    except Exception as exc:
        raise _bad(spec, f"the factory raised {type(exc).__name__}: {_first_line(exc)}",
                   "fix the factory") from None
    if not isinstance(built, ModelSpec):
        raise _bad(spec, f"the factory returned {type(built).__name__}, not a tracer.ModelSpec",
                   "return tracer.ModelSpec(model=..., make_batch=..., loss=..., units=...)")
    if not isinstance(built.model, nn.Module):
        raise _bad(spec, f"ModelSpec.model is a {type(built.model).__name__}", "pass an nn.Module")
    _check_model(spec, built.model)
    if cfg.wrap_min_params is not None:
        built = replace(built, wrap_min_params=cfg.wrap_min_params)
    return built


def _check_model(spec: str, model: nn.Module) -> None:
    from tracer.numerics import _WRAPPER_PARTS

    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            raise _bad(spec, f"{name} is {type(module).__name__}(p={module.p}): each rank and the "
                       "baseline would draw different masks", "build the model with dropout 0")
        clash = set(name.split(".")) & set(_WRAPPER_PARTS)
        if clash:
            raise _bad(spec, f"submodule {name} is named {sorted(clash)[0]!r}, a name DDP / FSDP "
                       "wrappers insert (tracer/numerics.py clean_fqn)", "rename that submodule")
        if any(p.device.type != "cpu" for p in module.parameters(recurse=False)):
            raise _bad(spec, f"{name or 'the model'} has parameters off the CPU",
                       "build the model on CPU; the tracer moves it to the rank's device")


def check_spec(cfg) -> ModelSpec:
    """Before any worker starts: build the spec and run one forward and loss on rank 0's rows.

    Refuses (``SpecError``, one line) a batch whose inputs or targets are not tensors with
    dim 0 = ``--batch``, a ``--batch`` that does not divide by the world size, a forward or loss
    that raises, and a loss that is not a finite scalar. Returns the spec (its model unchanged).
    """
    from tracer.model import rank_rows

    spec = load_spec(cfg)
    name = cfg.model
    try:
        x, y = spec.make_batch(cfg.batch, cfg.seed)
    except SystemExit as exc:
        raise _exited(name, "make_batch", exc) from None
    except Exception as exc:
        raise _bad(name, f"make_batch({cfg.batch}, {cfg.seed}) raised {type(exc).__name__}: "
                   f"{_first_line(exc)}", "fix make_batch") from None
    for what, t in (("inputs", x), ("targets", y)):
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != cfg.batch:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise _bad(name, f"make_batch({cfg.batch}, seed) {what} are {shape}, not a tensor of "
                       f"{cfg.batch} rows", "return (inputs, targets) tensors with dim 0 = batch_size")
    if cfg.batch % cfg.world_size:
        raise _bad(name, f"--batch {cfg.batch} does not divide by the world size {cfg.world_size}",
                   "pick a multiple")
    if cfg.row.dim_of("tensor") and spec.tp_plan is None:
        raise _bad(name, f"--strategy {cfg.strategy} needs a tensor-parallel plan and the ModelSpec "
                   "has none (tp_plan is None)", "set ModelSpec.tp_plan (tracer/modelspec.py), or "
                   "record another strategy")
    rows = rank_rows(cfg.batch, cfg.world_size, 0)
    if cfg.row.dim_of("stage"):
        from tracer.pipeline import check_split

        try:
            check_split(spec, cfg.pp_degree * cfg.pp_virtual_stages, x[rows])
        except ValueError as exc:
            raise _bad(name, f"--strategy pp: {exc}", "fix ModelSpec.pp_split (tracer/modelspec.py), "
                       "or record another strategy") from None
    try:
        loss = spec.loss(spec.model(x[rows]), y[rows])
    except SystemExit as exc:
        raise _exited(name, "the forward or loss", exc) from None
    except Exception as exc:
        raise _bad(name, f"the forward or loss raised {type(exc).__name__}: {_first_line(exc)}",
                   "fix the model or the loss") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not torch.isfinite(loss).all():
        raise _bad(name, f"the loss is {loss!r}, not a finite scalar tensor",
                   "return a mean over the batch")
    return spec

