"""Torch frontend on misuse: the traced model is left unchanged (weights, running stats, train
flags), bad inputs and failing tracers raise a TraceError with a fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphopt.errors import TraceError
from graphopt.frontends.torch_frontend import TRAINING_WARNING, trace_torch
from tests.torch_frontend_models import CNN, MLP, DataDependent, ManualAttention, only


def _snapshot(m: nn.Module) -> tuple[dict[str, torch.Tensor], list[bool]]:
    return ({k: v.clone() for k, v in m.state_dict().items()}, [x.training for x in m.modules()])


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("make", [CNN, DataDependent])
def test_model_is_not_changed(make: type[nn.Module], train: bool) -> None:
    m = make().train(train)
    m.dropout = nn.Dropout(0.5)  # an extra submodule: its flag must survive too
    x = torch.randn(4, 4, 16, 16) if make is CNN else torch.randn(4, 8)
    state, flags = _snapshot(m)
    g = trace_torch(m, x)
    after, after_flags = _snapshot(m)
    assert after_flags == flags
    assert state.keys() == after.keys()
    for k in state:
        assert torch.equal(state[k], after[k]), k  # running stats untouched by train-mode BN
    assert (TRAINING_WARNING in g.warnings) is train
    if train:
        assert only(g, "BatchNormalization").attrs["training_mode"] == 1


def test_bad_inputs_raise_trace_error_with_fix() -> None:
    with pytest.raises(TraceError, match="needs a torch.nn.Module") as e:
        trace_torch(lambda x: x, torch.randn(2))  # type: ignore[arg-type]
    assert e.value.fix
    with pytest.raises(TraceError, match="do not match MLP.forward") as e:
        trace_torch(MLP(), (torch.randn(2, 16), torch.randn(2, 16)))
    assert "one example value per" in (e.value.fix or "")
    with pytest.raises(TraceError, match="missing a required argument"):
        trace_torch(ManualAttention(), (torch.randn(2),))
    with pytest.raises(TraceError, match="no example inputs"):
        trace_torch(MLP(), None)
    with pytest.raises(TraceError, match="numpy"):
        trace_torch(MLP(), (torch.randn(2, 16).numpy(),))


def test_both_tracers_fail_gives_first_lines_and_fix() -> None:
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom: this model cannot run\nsecond line")

    with pytest.raises(TraceError) as e:
        trace_torch(Broken(), torch.randn(2))
    msg = str(e.value)
    assert "torch.export failed with ValueError: boom" in msg and "make_fx" in msg
    assert "Traceback" not in msg and "use_cache=False" in (e.value.fix or "")
    assert e.value.__cause__ is None and e.value.__suppress_context__
