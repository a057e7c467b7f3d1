"""PyTorch runtime settings per target, each with its reason, and a context manager applying them.

Rules (reasons cite the numbers):

1. TF32: ``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32`` and
   ``torch.set_float32_matmul_precision("high")`` on sm_80+ unless the plan's precision is a
   strict ``"fp32"``; TF32 keeps fp32's range with a 10-bit mantissa (bf16 has 7), so a plan
   that already accepts bf16/fp16/fp8 accepts it for its remaining fp32 GEMMs. Before sm_80
   there are no TF32 tensor cores: off / ``"highest"`` [PT-CUDA].
2. ``cudnn.benchmark`` on CUDA targets for conv nets with static shapes: cuDNN times its
   algorithms once per input shape and caches the winner; with dynamic shapes it re-times
   on every new shape [PT-TUNE].
3. ``PYTORCH_CUDA_ALLOC_CONF`` by memory size (a heuristic, not a measured optimum):
   >= 32 GiB -> ``expandable_segments:True`` (segments grow in place instead of leaving
   odd-sized cached blocks when shapes change, e.g. growing KV caches or varying batches);
   < 32 GiB -> ``max_split_size_mb:128,garbage_collection_threshold:0.8`` (large cached blocks
   are not split by small requests, and cached memory is reclaimed above 80% use, which is what
   avoids fragmentation OOMs on small cards) [PT-CUDA]. The allocator reads the variable when
   CUDA initializes, so it is only set before that; otherwise it is reported.
4. SDPA backend priority: ``flash`` on sm_80+ for fp16/bf16 with head_dim <= 256 and a multiple
   of 8; else ``efficient`` (memory-efficient kernel, fp32 too) when head_dim is 16-byte
   aligned; ``math`` always last as the fallback [PT-SDPA]. On CPU PyTorch has a flash kernel
   too (``torch._fused_sdp_choice`` returns FLASH_ATTENTION for CPU fp32/bf16/fp16 inputs on
   torch 2.13, checked here), so CPU gets ``flash`` then ``math``.
5. Batch size: the memory plan's recommended batch (``recommended_batch_size``: where the
   estimated samples/s stops improving, capped by what fits; ``decisions.batch_advice``), with
   the memory maximum beside it in the reason. Without the advice, the memory maximum.
6. CPU: ``torch.set_num_threads(physical cores)`` (SMT siblings share the FMA/AMX units, so
   extra threads only contend) and oneDNN (``torch.backends.mkldnn.enabled``) on [PT-TUNE].
7. ``compile_mode``: the ``torch.compile`` mode the plan favours (``decisions.compile_mode``);
   advice only, :func:`apply_runtime_settings` does not compile anything.

Sources:
  [PT-CUDA] PyTorch docs, "CUDA semantics": "TensorFloat-32 (TF32) on Ampere (and later)
            devices" and "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF".
  [PT-SDPA] PyTorch docs, ``torch.nn.functional.scaled_dot_product_attention`` and
            ``torch.nn.attention.sdpa_kernel``.
  [PT-TUNE] PyTorch Performance Tuning Guide: "Enable cuDNN auto-tuner", "Utilize OpenMP"
            (one thread per physical core).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.registry import get_target
from graphopt.ir.plan_memory import RuntimeSettings, Setting

__all__ = ["ALLOC_CONF_ENV", "RuntimeSettings", "Setting", "apply_runtime_settings",
           "runtime_settings", "snapshot_torch_state", "tf32_allowed"]

logger = logging.getLogger(__name__)

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
_GIB = 2**30
_LARGE_GPU_BYTES = 32 * _GIB  # rule 3 threshold: our choice, not a PyTorch constant
_SMALL_GPU_ALLOC_CONF = "max_split_size_mb:128,garbage_collection_threshold:0.8"
_LARGE_GPU_ALLOC_CONF = "expandable_segments:True"
_FLASH_MAX_HEAD_DIM = 256  # [PT-SDPA] flash kernel limit
_SIXTEEN_BIT = frozenset({"fp16", "bf16", "fp8", "int8", "int4", "fp4"})  # activations stay 16-bit


def _sdpa(t: HardwareProfile, precision: str, head_dim: int | None) -> Setting:
    if not t.is_gpu:
        return Setting(("flash", "math"), "rule 4: PyTorch's CPU flash-attention kernel, math "
                       "as fallback")
    cc = t.compute_capability or (0, 0)
    half = precision in _SIXTEEN_BIT
    hd_ok = head_dim is None or (head_dim <= _FLASH_MAX_HEAD_DIM and head_dim % 8 == 0)
    if cc >= (8, 0) and half and hd_ok:
        return Setting(("flash", "efficient", "math"), "rule 4: sm_80+, 16-bit activations, "
                       f"head_dim {head_dim or 'unknown'} fits flash (<= 256, multiple of 8)")
    why = ("before sm_80" if cc < (8, 0) else "fp32 activations" if not half
           else f"head_dim {head_dim} outside flash's limits")
    align = 8 if half else 4  # 16 bytes of head_dim
    if head_dim is None or head_dim % align == 0:
        return Setting(("efficient", "math"), f"rule 4: no flash ({why}); memory-efficient "
                       "kernel, math as fallback")
    return Setting(("math",), f"rule 4: no flash ({why}) and head_dim {head_dim} is not "
                   f"{align}-element aligned for the memory-efficient kernel")


def tf32_allowed(target: HardwareProfile, precision: str) -> bool:
    """Rule 1: TF32 tensor cores for fp32 GEMMs and convs where the GPU has them and the
    precision asked for is not strict ``"fp32"`` (torch's flags and ORT's ``use_tf32`` both)."""
    return target.has("tf32") and precision != "fp32"


def runtime_settings(target: HardwareProfile | str, *, precision: str = "bf16",
                     has_convs: bool = False, static_shapes: bool = True,
                     max_batch_size: int | None = None,
                     head_dim: int | None = None, batch_size: int | None = None,
                     batch_reason: str | None = None) -> RuntimeSettings:
    """Settings for running a plan on ``target`` (a profile or a target name); ``batch_size``
    and ``batch_reason``: the memory plan's recommended batch and why (rule 5)."""
    if isinstance(target, str):
        target = get_target(target)
    t = target
    if batch_size is not None:
        batch = Setting(batch_size, f"rule 5: {batch_reason or 'the recommended batch'}")
    else:
        batch = Setting(max_batch_size, "rule 5: largest batch the memory plan fits" if
                        max_batch_size is not None else "rule 5: no memory plan given")
    sdpa = _sdpa(t, precision, head_dim)
    if not t.is_gpu:
        na = "not applicable on a CPU target"
        return RuntimeSettings(
            target=t.name, device="cpu", matmul_allow_tf32=Setting(None, f"rule 1: {na}"),
            cudnn_allow_tf32=Setting(None, f"rule 1: {na}"),
            float32_matmul_precision=Setting("highest", "rule 1: CPUs have no TF32 units; "
                                             "'highest' (PyTorch's default) keeps fp32 exact"),
            cudnn_benchmark=Setting(None, f"rule 2: no cuDNN, {na}"),
            cuda_alloc_conf=Setting(None, f"rule 3: {na}"), sdpa_backends=sdpa,
            batch_size=batch,
            num_threads=Setting(t.cores, f"rule 6: one thread per physical core ({t.cores})"),
            mkldnn_enabled=Setting(True, "rule 6: oneDNN conv/linear kernels for x86/aarch64"))
    cc = t.compute_capability or (0, 0)
    tf32_hw = t.has("tf32")
    tf32 = tf32_allowed(t, precision)
    if not tf32_hw:
        why = f"rule 1: sm_{cc[0]}{cc[1]} has no TF32 tensor cores"
    elif tf32:
        why = f"rule 1: sm_{cc[0]}{cc[1]} has TF32 and precision {precision!r} tolerates it"
    else:
        why = "rule 1: precision 'fp32' asks for IEEE fp32 matmuls"
    bench = has_convs and static_shapes
    bench_why = ("rule 2: static-shape conv net, cuDNN autotunes once per shape" if bench else
                 "rule 2: no convolutions, nothing to autotune" if not has_convs else
                 "rule 2: dynamic shapes would re-run cuDNN's autotuning on every new shape")
    gib = t.memory_bytes / _GIB
    if t.memory_bytes >= _LARGE_GPU_BYTES:
        alloc = Setting(_LARGE_GPU_ALLOC_CONF, f"rule 3: {gib:.0f} GiB >= 32 GiB, expandable "
                        "segments avoid fragmentation when sizes change (Linux only)")
    else:
        alloc = Setting(_SMALL_GPU_ALLOC_CONF, f"rule 3: {gib:.0f} GiB < 32 GiB, keep large "
                        "blocks unsplit and reclaim cache above 80% to avoid fragmentation OOMs")
    return RuntimeSettings(
        target=t.name, device="cuda", matmul_allow_tf32=Setting(tf32, why),
        cudnn_allow_tf32=Setting(tf32, why),
        float32_matmul_precision=Setting("high" if tf32 else "highest", why),
        cudnn_benchmark=Setting(bench, bench_why), cuda_alloc_conf=alloc, sdpa_backends=sdpa,
        batch_size=batch, num_threads=Setting(None, "rule 6: host threads left alone on GPU "
                                              "targets"),
        mkldnn_enabled=Setting(None, "rule 6: oneDNN is a CPU backend"))


# --- applying and restoring -------------------------------------------------------------------

_UNREADABLE = "<unreadable>"  # torch >= 2.9 refuses to read legacy TF32 flags after mixed use
# New-style per-backend fp32 precision knobs (torch >= 2.9); absent ones are skipped.
_FP32_PRECISION_PATHS = ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn",
                         "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")
_SDPA_NAMES = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH",
               "cudnn": "CUDNN_ATTENTION"}


def _obj(torch: Any, path: str) -> Any:
    obj = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part, None)
    return obj


def _read(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except RuntimeError:
        return _UNREADABLE


def snapshot_torch_state() -> dict[str, Any]:
    """Every process-wide knob :func:`apply_runtime_settings` may touch, for exact restores."""
    import torch

    b = torch.backends
    state: dict[str, Any] = {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda.matmul.allow_tf32": _read(lambda: b.cuda.matmul.allow_tf32),
        "cudnn.allow_tf32": _read(lambda: b.cudnn.allow_tf32),
        "cudnn.benchmark": b.cudnn.benchmark,
        "num_threads": torch.get_num_threads(),
        "mkldnn.enabled": b.mkldnn.enabled,
        "sdp": (b.cuda.flash_sdp_enabled(), b.cuda.mem_efficient_sdp_enabled(),
                b.cuda.math_sdp_enabled(), getattr(b.cuda, "cudnn_sdp_enabled", lambda: None)()),
        ALLOC_CONF_ENV: os.environ.get(ALLOC_CONF_ENV),
    }
    get_order = getattr(torch._C, "_get_sdp_priority_order", None)
    if get_order is not None:
        state["sdp_priority"] = tuple(get_order())
    for path in _FP32_PRECISION_PATHS:
        obj = _obj(torch, path)
        if obj is not None and hasattr(obj, "fp32_precision"):
            state[f"fp32_precision:{path}"] = obj.fp32_precision
    return state


def _restore(torch: Any, s: dict[str, Any]) -> None:
    """Legacy knobs first (their setters rewrite the new-style strings), then the strings."""
    b = torch.backends
    torch.set_float32_matmul_precision(s["float32_matmul_precision"])
    for key, obj in (("cuda.matmul.allow_tf32", b.cuda.matmul), ("cudnn.allow_tf32", b.cudnn)):
        if s[key] != _UNREADABLE:
            obj.allow_tf32 = s[key]
    for key, value in s.items():
        if key.startswith("fp32_precision:"):
            _obj(torch, key.partition(":")[2]).fp32_precision = value
    b.cudnn.benchmark = s["cudnn.benchmark"]
    torch.set_num_threads(s["num_threads"])
    b.mkldnn.enabled = s["mkldnn.enabled"]
    if s[ALLOC_CONF_ENV] is None:
        os.environ.pop(ALLOC_CONF_ENV, None)
    else:
        os.environ[ALLOC_CONF_ENV] = s[ALLOC_CONF_ENV]


def _apply(torch: Any, st: RuntimeSettings, stack: ExitStack, report: dict[str, str]) -> None:
    b = torch.backends
    if st.float32_matmul_precision.value is not None:
        torch.set_float32_matmul_precision(st.float32_matmul_precision.value)
        report["float32_matmul_precision"] = f"set to {st.float32_matmul_precision.value!r}"
    for name, obj in (("matmul_allow_tf32", b.cuda.matmul), ("cudnn_allow_tf32", b.cudnn)):
        value = getattr(st, name).value
        if value is not None:
            obj.allow_tf32 = value
            report[name] = f"set to {value}"
    if st.cudnn_benchmark.value is not None:
        b.cudnn.benchmark = st.cudnn_benchmark.value
        report["cudnn_benchmark"] = f"set to {st.cudnn_benchmark.value}"
    if st.num_threads.value is not None:  # never past this machine's CPUs: a plan (or file)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)  # made for a bigger CPU would oversubscribe this one
        threads = max(1, min(int(st.num_threads.value), cpus))
        torch.set_num_threads(threads)
        report["num_threads"] = f"set to {threads}" + (
            f" (the plan's {st.num_threads.value} is more than this machine's {cpus} CPUs)"
            if threads != st.num_threads.value else "")
    if st.mkldnn_enabled.value is not None:
        b.mkldnn.enabled = st.mkldnn_enabled.value
        report["mkldnn_enabled"] = f"set to {st.mkldnn_enabled.value}"
    conf = st.cuda_alloc_conf.value
    if conf is not None:
        if torch.cuda.is_initialized():
            report["cuda_alloc_conf"] = (f"not applied: CUDA is already initialized; set "
                                         f"{ALLOC_CONF_ENV}={conf} before the process starts")
        elif os.environ.get(ALLOC_CONF_ENV):
            report["cuda_alloc_conf"] = (f"not applied: kept the user's {ALLOC_CONF_ENV}="
                                         f"{os.environ[ALLOC_CONF_ENV]}")
        else:
            os.environ[ALLOC_CONF_ENV] = conf
            report["cuda_alloc_conf"] = f"set {ALLOC_CONF_ENV}={conf} (read when CUDA initializes)"
    if st.sdpa_backends.value:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = [getattr(SDPBackend, _SDPA_NAMES[n]) for n in st.sdpa_backends.value]
        try:
            stack.enter_context(sdpa_kernel(backends, set_priority=True))
        except TypeError:  # torch < 2.6: no priority order, only the allowed set
            stack.enter_context(sdpa_kernel(backends))
        report["sdpa_backends"] = f"priority {list(st.sdpa_backends.value)}"


@contextmanager
def apply_runtime_settings(settings: RuntimeSettings) -> Iterator[dict[str, str]]:
    """Apply ``settings`` for the ``with`` block; yields what was (not) applied and why.

    On exit, normal or by exception, every knob returns to its exact previous value (legacy
    TF32 flags, the new per-backend ``fp32_precision`` strings, cudnn.benchmark, threads,
    oneDNN, SDPA flags and priority, and the allocator environment variable). Note that an
    allocator configured while CUDA initialized inside the block stays configured.
    """
    import torch

    before = snapshot_torch_state()
    report: dict[str, str] = {}
    with ExitStack() as stack:
        try:
            _apply(torch, settings, stack, report)
            logger.info("applied runtime settings for %s: %s", settings.target, report)
            yield report
        finally:
            stack.close()
            _restore(torch, before)
            after = snapshot_torch_state()
            if after != before:
                changed = sorted(k for k in before if before[k] != after.get(k))
                logger.warning("runtime settings not fully restored: %s", changed)
