"""A deploy folder: the recommended artifact, its settings and ``deploy.json``, written by
``Optimized.save_deploy(folder)`` and ``graphopt optimize ... -o out/``; :func:`load` reads
any graphopt output (a ``.pt2`` file, or such a folder) ready to run.

The folder holds, by the artifact ``deploy.json`` names:
- torch and torch.compile: ``model.pt2`` (``graphopt.load`` reads it; runtime settings,
  shape range and plan inside); for torch.compile, ``deploy.json`` gives the compile mode and
  :func:`load` compiles the module with it;
- onnxruntime: ``model.onnx`` and ``model.graphopt.json`` (its session config:
  ``graphopt.ort_session`` loads both).

The file names are fixed: ``deploy.json`` names the artifact, never a path, so a folder from
elsewhere cannot point the loader at another file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from graphopt.decisions.deploy import ARTIFACTS
from graphopt.errors import GraphoptError
from graphopt.files.outputs import OutputSet
from graphopt.files.read import read_small_file

__all__ = ["DEPLOY_FILE", "is_deploy_folder", "load", "stage_deploy"]

DEPLOY_FILE = "deploy.json"
_FILES = {"torch": "model.pt2", "torch.compile": "model.pt2", "onnxruntime": "model.onnx"}
_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_MAX_BYTES = 1 << 20  # deploy.json is a few kB
_REWRITE = "write the folder again with graphopt optimize ... -o DIR/ (or Optimized.save_deploy)"


def is_deploy_folder(path: str | os.PathLike[str]) -> bool:
    """``-o out/`` asks for a folder: a path ending in a separator, or an existing folder."""
    text = os.fspath(path)
    return text.endswith(("/", os.sep)) or Path(text).is_dir()


def stage_deploy(opt: Any, outputs: OutputSet, folder: str | os.PathLike[str]
                 ) -> list[Path]:
    """Stage the recommended artifact and ``deploy.json`` in ``folder`` (written on
    ``outputs.commit()``); returns the staged paths."""
    from graphopt.backends.onnx.save import claim_onnx, stage_onnx
    from graphopt.backends.onnx.session import config_path
    from graphopt.backends.torch.saved import stage

    choice = opt.deploy
    if choice is None:
        raise GraphoptError("this result has no deploy choice", "optimize the model again")
    base = Path(folder)
    artifact_path = base / _FILES[choice.artifact]
    record = {"artifact": choice.artifact, "file": artifact_path.name,
              "load": f"graphopt.load({os.fspath(base)!r})", **choice.to_dict()}
    if choice.artifact == "onnxruntime":
        model = opt.ensure_onnx()
        claim_onnx(outputs, artifact_path, model)
        stage_onnx(outputs, model, artifact_path, opt.onnx_session)
        record["session_config"] = config_path(artifact_path).name
        paths = [artifact_path, config_path(artifact_path)]
    else:
        stage(opt, outputs, artifact_path)
        paths = [artifact_path]
        if choice.artifact == "torch.compile":
            record["compile_mode"] = opt.runtime_settings.compile_mode.value
    deploy_json = base / DEPLOY_FILE
    deploy_json = outputs.resolve(deploy_json) if outputs.claimed(deploy_json) else \
        outputs.claim(deploy_json, "deploy record")
    outputs.write(deploy_json, json.dumps(record, indent=1, allow_nan=False,
                                          default=str) + "\n", "deploy record")
    return [*paths, deploy_json]


def load(path: str | os.PathLike[str], device: Any = None) -> Any:
    """What graphopt wrote at ``path``, ready to run: a ``.pt2`` file's module
    (``graphopt.backends.torch.load``), or a deploy folder's recommended artifact: the torch
    module, that module compiled with ``torch.compile`` in the recorded mode, or an
    ``onnxruntime.InferenceSession`` in its session config (``device`` is for torch
    artifacts)."""
    from graphopt.backends.torch.load import load as load_pt2

    folder = Path(path)
    if not folder.is_dir():
        return load_pt2(folder, device)
    record = _record(folder)
    artifact = record["artifact"]
    if artifact == "onnxruntime":
        from graphopt.backends.onnx.session import ort_session

        return ort_session(folder / _FILES[artifact])
    module = load_pt2(folder / _FILES[artifact], device)
    if artifact == "torch":
        return module
    import torch

    mode = record.get("compile_mode", "default")
    return torch.compile(module, mode=None if mode == "default" else mode)


def _record(folder: Path) -> dict[str, Any]:
    """``deploy.json``, checked: a regular small file naming a known artifact."""
    path = folder / DEPLOY_FILE
    if not path.exists():
        raise GraphoptError(f"{folder} is a folder without {DEPLOY_FILE}: not a graphopt deploy "
                            "folder", "give the .pt2 file, or a folder graphopt optimize -o DIR/ "
                            "wrote")
    raw = read_small_file(path, _MAX_BYTES, f"the deploy record {path}", _REWRITE, "a few kB")
    try:
        record = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise GraphoptError(f"cannot read {path}: {type(e).__name__}: {str(e)[:200]}",
                            _REWRITE) from None
    if not isinstance(record, dict) or record.get("artifact") not in ARTIFACTS:
        got = record.get("artifact") if isinstance(record, dict) else type(record).__name__
        raise GraphoptError(f"{path} names no artifact graphopt writes ({str(got)[:60]!r}; "
                            f"expected one of {', '.join(ARTIFACTS)})", _REWRITE)
    if record.get("compile_mode", "default") not in _COMPILE_MODES:
        raise GraphoptError(f"{path}: compile_mode {str(record.get('compile_mode'))[:60]!r} is "
                            f"not a torch.compile mode ({', '.join(_COMPILE_MODES)})", _REWRITE)
    return record
