"""A deploy folder: the recommended artifact, its settings and ``deploy.json``, written by
``Optimized.save_deploy(folder)`` and ``graphopt optimize ... -o out/``; :func:`load` reads
any graphopt output (a ``.pt2`` file, or such a folder) ready to run.

The folder holds, by the artifact ``deploy.json`` names:
- torch and torch.compile: ``model.pt2`` (``graphopt.load`` reads it; runtime settings,
  shape range and plan inside); for torch.compile, ``deploy.json`` gives the compile mode and
  :func:`load` compiles the module with it;
- onnxruntime: ``model.onnx`` and ``model.graphopt.json`` (its session config:
  ``graphopt.ort_session`` loads both);
- openvino: ``model.onnx`` (the same optimized ONNX model) and ``model.openvino.json`` (its
  compile config: the inference precision it was checked at). The ONNX model, not OpenVINO's
  IR: it is the very file the guard checked and the ONNX Runtime artifact ships (one writer,
  one external-data rule for models past 2 GiB), ONNX opsets stay readable by later OpenVINO
  releases while an IR is OpenVINO's own format, and the precision is a compile setting that
  no model file holds, so a config travels either way. The cost: OpenVINO converts the ONNX
  model at each load (under a second for small models).

The file names are fixed: ``deploy.json`` names the artifact, never a path, so a folder from
elsewhere cannot point the loader at another file. Every field of ``deploy.json`` is checked
when it is read (:mod:`.deploy_record`). Before the work, :func:`claim_deploy` claims
``deploy.json`` and reserves every artifact file name, so no report can be written over the
artifact, whichever one the work picks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from graphopt.api.deploy import Deployed, deployed
from graphopt.api.deploy_record import DEPLOY_FILE, FILES, read_record
from graphopt.backends.onnx.save import claim_onnx, stage_onnx
from graphopt.backends.onnx.session import config_path, ort_session
from graphopt.backends.openvino.config import compile_config_path, render_compile_config
from graphopt.backends.openvino.runner import load_openvino
from graphopt.errors import GraphoptError
from graphopt.files.outputs import OutputSet

__all__ = ["ARTIFACT_SUFFIXES", "DEPLOY_FILE", "claim_deploy", "is_deploy_folder", "load",
           "stage_deploy"]

#: a path with one of these suffixes names an artifact file, never a deploy folder
ARTIFACT_SUFFIXES = (".onnx", ".pt2")
_MAX_BYTES = 1 << 20  # deploy.json is a few kB
_REWRITE = "write the folder again with graphopt optimize ... -o DIR/ (or Optimized.save_deploy)"


def is_deploy_folder(path: str | os.PathLike[str]) -> bool:
    """``-o out/`` asks for a folder: a path ending in a separator, or an existing folder
    whose name has no artifact suffix (an existing folder ``x.onnx`` asks for a file there,
    which ``OutputSet`` refuses)."""
    text = os.fspath(path)
    if not text:
        return False
    return text.endswith(("/", os.sep)) or (Path(text).is_dir() and
                                             Path(text).suffix not in ARTIFACT_SUFFIXES)


def claim_deploy(outputs: OutputSet, folder: str | os.PathLike[str]) -> Path:
    """Claim ``folder``'s ``deploy.json`` and reserve each artifact's files there (the work
    picks one), so that no other output (a report) can go to one; returns deploy.json."""
    if not os.fspath(folder):
        raise GraphoptError("the deploy folder path is empty",
                            "give a folder, e.g. out/ (the current folder is never implied)")
    base = Path(folder)
    onnx_file = base / FILES["onnxruntime"]
    for path, what in ((base / FILES["torch"], "saved model"), (onnx_file, "model"),
                       (config_path(onnx_file), "session config"),
                       (compile_config_path(onnx_file), "compile config"),
                       (onnx_file.with_name(f"{onnx_file.name}.data"), "model data")):
        outputs.reserve(path, what)
    return outputs.hold(base / DEPLOY_FILE, "deploy record")


def stage_deploy(opt: Any, outputs: OutputSet, folder: str | os.PathLike[str]
                 ) -> list[Path]:
    """Stage the recommended artifact and ``deploy.json`` in ``folder`` (written on
    ``outputs.commit()``); returns the staged paths."""
    from graphopt.backends.torch.saved import stage

    choice = opt.deploy
    if choice is None:
        raise GraphoptError("this result has no deploy choice", "optimize the model again")
    deploy_json = claim_deploy(outputs, folder)
    base = Path(folder)
    artifact_path = base / FILES[choice.artifact]
    record = {"artifact": choice.artifact, "file": artifact_path.name,
              "load": f"graphopt.load({os.fspath(base)!r})", **choice.to_json()}
    if choice.artifact == "onnxruntime":
        model = opt.ensure_onnx()
        claim_onnx(outputs, artifact_path, model)
        stage_onnx(outputs, model, artifact_path, opt.onnx_session)
        record["session_config"] = config_path(artifact_path).name
        paths = [artifact_path, config_path(artifact_path)]
    elif choice.artifact == "openvino":
        compiled = deployed(opt).session  # the precision it was checked (or is built) at
        model = opt.ensure_onnx()
        claim_onnx(outputs, artifact_path, model)
        stage_onnx(outputs, model, artifact_path)
        cfg_path = compile_config_path(artifact_path)
        outputs.write(cfg_path, render_compile_config(compiled.config), "compile config")
        record["compile_config"] = cfg_path.name
        paths = [artifact_path, cfg_path]
    else:
        stage(opt, outputs, artifact_path)
        paths = [artifact_path]
        if choice.artifact == "torch.compile":
            record["compile_mode"] = opt.runtime_settings.compile_mode.value
    outputs.write(deploy_json, json.dumps(record, indent=1, allow_nan=False,
                                          default=str) + "\n", "deploy record")
    return [*paths, deploy_json]


def load(path: str | os.PathLike[str], device: Any = None) -> Any:
    """What graphopt wrote at ``path``, ready to run: a ``.pt2`` file's module
    (``graphopt.backends.torch.load``), or a deploy folder's recommended artifact: the torch
    module, that module compiled with ``torch.compile`` in the recorded mode, an
    ``onnxruntime.InferenceSession`` in its session config, or for OpenVINO a
    :class:`~graphopt.api.deploy.Deployed` (called with torch tensors or numpy arrays; its
    ``session`` has ``run(None, feeds)`` as ORT's) compiled with its compile config.
    ``device`` moves a torch artifact there, and picks an ONNX session's provider
    (``backends.onnx.session.device_providers``): a device ONNX Runtime here cannot run on is
    an error, never a CPU session; OpenVINO runs on the CPU only."""
    folder = Path(path)
    record = read_record(folder, _MAX_BYTES, _REWRITE) if folder.is_dir() else {}
    artifact = record.get("artifact")
    if artifact == "onnxruntime":
        return ort_session(folder / FILES[artifact], device=device)
    if artifact == "openvino":  # torch is never imported: it runs on numpy arrays too
        if device is not None and str(device) != "cpu":
            raise GraphoptError(f"device {str(device)[:60]!r}: graphopt's OpenVINO artifact "
                                "runs on this machine's CPU", "load it with device='cpu' (or "
                                "none), or deploy another artifact for that device")
        return Deployed("openvino", session=load_openvino(folder / FILES[artifact]))
    from graphopt.backends.torch.load import load as load_pt2

    if artifact is None:
        return load_pt2(folder, device)
    module = load_pt2(folder / FILES[artifact], device)
    if artifact == "torch":
        return module
    import torch

    mode = record.get("compile_mode", "default")
    return torch.compile(module, mode=None if mode == "default" else mode)
