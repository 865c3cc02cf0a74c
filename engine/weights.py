"""Filling a model's parameters: seeded dummy values or a local HF checkpoint.

No hub downloads: ``load_checkpoint`` reads a local directory (``config.json`` plus
``*.safetensors`` or ``pytorch_model.bin`` / ``*.pt``) or a single weights file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from core.model_spec import ModelSpec
from engine.models.llama import RMSNorm

DEFAULT_STD = 0.02

# Older checkpoints store RoPE tables as buffers; the engine recomputes them.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int, std: float = DEFAULT_STD) -> None:
    """Fill every parameter with seeded values: matrices and embeddings ~ N(0, std²),
    biases 0, norm weights 1.

    std 0.02 is the usual GPT/OPT/Llama init (``initializer_range``). It keeps activations
    O(1) at real widths: a projection of a unit-RMS input has RMS ``std * sqrt(width)``,
    about 1.4 at hidden 5120, and pre-norm residual streams grow only additively, so fp16 and
    bf16 forward passes stay finite. Values are drawn in fp32 on the parameter's device and
    then cast, so a seed gives the same weights for every dtype on a given device type.
    """
    if std <= 0:
        raise ValueError(f"std must be positive, got {std}")
    seen: set[int] = set()
    generators: dict[torch.device, torch.Generator] = {}
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(module, (nn.LayerNorm, RMSNorm)):
                param.fill_(1.0 if param_name == "weight" else 0.0)
            elif param_name == "bias":
                param.zero_()
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                gen = generators.get(param.device)
                if gen is None:
                    gen = torch.Generator(device=param.device).manual_seed(seed)
                    generators[param.device] = gen
                values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
                param.copy_(values.normal_(0.0, std, generator=gen))
            else:
                raise TypeError(
                    f"init_dummy_weights has no rule for {module_name}.{param_name} "
                    f"({type(module).__name__})"
                )


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the model; the message names the file and
    what is wrong (unreadable, not a state dict, keys or shapes the model does not have)."""


def load_checkpoint(model: nn.Module, path: str | Path) -> None:
    """Load a local HF checkpoint into ``model`` (see ``load_weights`` for key rules).

    ``path`` is a directory or one weights file. In a directory, all ``*.safetensors``
    files are read if any exist, else ``pytorch_model.bin`` or ``*.pt`` / ``*.bin``. If the
    directory has a ``config.json`` and the model has a ``config``, they must agree. Any
    failure is a :class:`CheckpointError`.
    """
    path = Path(path)
    try:
        if not path.exists():
            raise FileNotFoundError(f"checkpoint path {path} does not exist")
        if path.is_dir():
            config_file = path / "config.json"
            model_config = getattr(model, "config", None)
            if config_file.is_file() and isinstance(model_config, ModelSpec):
                _check_same_config(ModelSpec.from_json(config_file), model_config)
            files = _weight_files(path)
        else:
            files = [path]
        load_weights(model, _iter_tensors(files))
    except CheckpointError:
        raise
    except (ValueError, FileNotFoundError) as exc:
        raise CheckpointError(str(exc)) from exc


def load_weights(model: nn.Module, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy named tensors (HF state-dict keys) into ``model``'s parameters, cast to their dtype.

    Keys ``decoder.*`` (OPT checkpoints saved from the bare ``OPTModel``) are read as
    ``model.decoder.*``; ``*rotary_emb.inv_freq`` buffers are ignored. A tied LM head may be
    absent (it is the embedding). Raises naming the keys on a shape mismatch, on keys the
    model lacks, on parameters the checkpoint lacks, or on a tensor that holds NaN or inf
    in the model's dtype (every token would come out the same). Tensors are copied as they
    stream in (a checkpoint is not held twice), so after a raise the model is partly
    loaded: discard it.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    unexpected: list[str] = []
    with torch.no_grad():
        for raw_name, tensor in tensors:
            if raw_name.endswith(_IGNORED_SUFFIXES):
                continue
            name = raw_name
            if name not in params and f"model.{name}" in params:
                name = f"model.{name}"
            param = params.get(name)
            if param is None:
                unexpected.append(raw_name)
                continue
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(
                    f"shape mismatch for {name}: checkpoint {tuple(tensor.shape)}, "
                    f"model {tuple(param.shape)}"
                )
            param.copy_(tensor.to(device=param.device, dtype=param.dtype))
            if not bool(torch.isfinite(param).all()):
                raise ValueError(
                    f"{raw_name} holds non-finite values (NaN or inf) once in {param.dtype}: "
                    "a damaged checkpoint, or values beyond the dtype's range"
                )
            loaded.add(name)
    if unexpected:
        raise ValueError(f"checkpoint has keys the model lacks: {_names(unexpected)}")
    missing = [
        n for n, p in params.items() if n not in loaded and not _loaded_via_tie(p, params, loaded)
    ]
    if missing:
        raise ValueError(f"checkpoint lacks parameters: {_names(missing)}")


def _loaded_via_tie(param: nn.Parameter, params: dict[str, nn.Parameter], loaded: set[str]) -> bool:
    return any(params[name] is param for name in loaded)


def _names(keys: list[str], limit: int = 10) -> str:
    shown = ", ".join(sorted(keys)[:limit])
    return shown if len(keys) <= limit else f"{shown}, ... ({len(keys)} in all)"


def _weight_files(directory: Path) -> list[Path]:
    safetensors = sorted(directory.glob("*.safetensors"))
    if safetensors:
        return safetensors
    torch_files = sorted(
        p for p in directory.iterdir() if p.suffix in (".bin", ".pt") and p.is_file()
    )
    if torch_files:
        return torch_files
    raise FileNotFoundError(
        f"no weights in {directory}: expected *.safetensors, pytorch_model.bin or *.pt"
    )


def _iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        if file.suffix == ".safetensors":
            yield from _safetensors(file)
            continue
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:  # the unpickler's errors name no file: any is unreadable
            raise CheckpointError(
                f"{file} cannot be read as a torch weights file (torch.load with weights_only: "
                f"{type(exc).__name__})"
            ) from exc
        if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
        ):
            raise CheckpointError(f"{file} is not a state dict of name -> tensor")
        yield from state.items()


def _safetensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    try:
        handle = safe_open(str(file), framework="pt")
    except Exception as exc:  # safetensors' own error type: a bad header, a short file
        lines = str(exc).strip().splitlines()
        why = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        raise CheckpointError(f"{file} cannot be read as a safetensors file ({why})") from exc
    with handle as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            yield key, f.get_tensor(key)


def _check_same_config(checkpoint: ModelSpec, model: ModelSpec) -> None:
    diffs = [
        f"{field}: checkpoint {getattr(checkpoint, field)!r}, model {getattr(model, field)!r}"
        for field in model.__dataclass_fields__
        if field not in ("name", "hf_id") and getattr(checkpoint, field) != getattr(model, field)
    ]
    if diffs:
        raise ValueError(
            "checkpoint config.json differs from the model's config: " + "; ".join(diffs)
        )
