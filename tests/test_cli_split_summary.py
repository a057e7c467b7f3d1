"""``graphopt plan --devices`` says on the console what the split is (issue 35, item 4): the
strategy, each device's share and the estimate, from the plan's own partition section."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphopt.api.planning import plan
from graphopt.cli.main import main
from graphopt.cli.split_summary import split_lines

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "resnet_like.py") + ":build"
DEVICES = "cuda:0=h100,cuda:1=a100"


@pytest.mark.parametrize("strategy", ["pipeline", "auto"])
def test_plan_with_devices_prints_the_split(strategy: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", EXAMPLE, "--devices", DEVICES, "--strategy", strategy]) == 0
    out = capsys.readouterr().out
    result = plan(EXAMPLE, devices=DEVICES, strategy=strategy)
    part = result.partition
    assert part is not None
    assert f"split: {part.strategy} over 2 device(s)" in out
    for device in part.devices:
        placed = sum(row.device == device.name for row in part.schedule)
        assert f"    {device.name} ({device.target}): {placed} node(s)" in out
    assert ("strategy: " in out) == (strategy == "auto")
    assert sum(line.startswith("  split: ") for line in out.splitlines()) == 1


def test_no_devices_no_split_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", EXAMPLE]) == 0
    assert "split:" not in capsys.readouterr().out
    assert split_lines(plan(EXAMPLE)) == []
