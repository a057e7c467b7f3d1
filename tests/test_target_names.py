"""What a user reads about target names (issue 35, item 4): ``graphopt targets`` lists every
alias beside its target, and an unknown name gets a near miss from the same kind of hardware,
or a plain statement that the database does not cover it, never another vendor's part."""

from __future__ import annotations

import json

import pytest

from graphopt.cli.main import main
from graphopt.errors import UnknownTargetError
from graphopt.hardware import get_target
from graphopt.hardware.registry import ALIASES


def _fix(name: str) -> str:
    with pytest.raises(UnknownTargetError) as e:
        get_target(name)
    return e.value.fix or ""


@pytest.mark.parametrize("name, what", [
    ("mi300x", "no AMD GPUs"), ("MI250", "no AMD GPUs"), ("radeon-7900", "no AMD GPUs"),
    ("gaudi3", "no Intel accelerators"), ("tpu-v5e", "no Google TPUs"),
    ("trainium2", "no AWS Trainium"), ("m2max", "no Apple silicon")])
def test_an_uncovered_vendor_is_said_plainly(name: str, what: str) -> None:
    fix = _fix(name)
    assert what in fix and "did you mean" not in fix


@pytest.mark.parametrize("name, near, kind", [
    ("h10", "h100", "gpu"), ("xeon-8490", "xeon-8480", "cpu"), ("epyc-9655", "epyc-9654", "cpu"),
    ("rtx4080", "rtx-4090", "gpu")])
def test_a_near_miss_comes_from_the_same_kind(name: str, near: str, kind: str) -> None:
    assert f"did you mean {near!r}?" in _fix(name)
    assert get_target(near).kind == kind


def test_a_cpu_name_is_never_answered_with_a_gpu() -> None:
    fix = _fix("xeon-9999")
    close = fix.split("'")[1] if "did you mean" in fix else None
    assert close is None or get_target(close).kind == "cpu"


def test_targets_lists_every_alias(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["targets"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    for alias, target in ALIASES.items():
        assert alias in rows[target].split("TFLOP/s", 1)[1].replace(",", " ").split(), alias
    assert main(["targets", "--json"]) == 0
    listed = {r["name"]: r["aliases"] for r in json.loads(capsys.readouterr().out)}
    for alias, target in ALIASES.items():
        assert alias in listed[target]
        assert get_target(alias).name == target
