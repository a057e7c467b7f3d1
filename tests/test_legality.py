"""Legality is a value: a ``can_*`` check answers ok, or not with its reason (issue 32)."""

from __future__ import annotations

import pytest

from graphopt.decisions.layout.channels_last import can_channels_last
from graphopt.ir.legality import Legality


def test_ok_is_truthy_and_has_no_reason() -> None:
    assert Legality.OK and Legality.OK.ok and Legality.OK.reason == ""


def test_no_is_falsy_and_keeps_its_reason() -> None:
    legal = Legality.no("grouped transposed conv")
    assert not legal and not legal.ok and legal.reason == "grouped transposed conv"


@pytest.mark.parametrize("ok, reason", [(True, "why"), (False, "")])
def test_an_answer_is_either_ok_or_a_reason(ok: bool, reason: str) -> None:
    with pytest.raises(ValueError):
        Legality(ok, reason)


def test_a_check_answers_with_a_legality() -> None:
    legal = can_channels_last(None)
    assert isinstance(legal, Legality) and not legal
    assert legal.reason == "not a 2-D/3-D conv with known shapes"
