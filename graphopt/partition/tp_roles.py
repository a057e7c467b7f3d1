"""The typed roles of tensor parallelism: a block's kind, a collective's kind, a node's role in
its block, a node's share of the work on each device.

Why enums: these used to be plain strings spread over parallel dicts, and a node's share was
read back out of its reason text. Each is a ``StrEnum`` so the JSON report and the report text
(which print the value) stay as they were.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["BlockKind", "CollectiveKind", "Role", "Share"]


class BlockKind(StrEnum):
    """What a tensor-parallel block is (:class:`.tp_blocks.TPBlock`'s ``kind``)."""

    MLP = "mlp"
    ATTENTION = "attention"
    LM_HEAD = "lm_head"  # vocabulary-parallel: a column GEMM, its logits all-gathered


class CollectiveKind(StrEnum):
    """A collective on the tensor-parallel timeline."""

    ALL_REDUCE = "all-reduce"  # after a row GEMM
    REDUCE_SCATTER = "reduce-scatter"  # a row GEMM read only by token-sharded nodes
    ALL_GATHER = "all-gather"  # the LM head's logits, or a token-sharded tensor


class Role(StrEnum):
    """How a node's work is cut on each of ``t`` devices
    (:func:`.tensor_parallel.split_analysis`)."""

    COLUMN = "column"  # a GEMM computing N / t of its outputs
    ROW = "row"  # a GEMM reading K / t of its input, writing a partial sum
    INNER = "inner"  # any other node of a block, or a sharded tail: 1/t of the work
    TOKENS = "tokens"  # sequence parallel: 1/t of the tokens, parameters whole


class Share(StrEnum):
    """A node's share of the work on each device of its group, as the ``device`` decision says."""

    REPLICATED = "replicated"  # whole on every device
    SPLIT = "split"  # 1/t of it
    TOKENS = "tokens"  # 1/t of the tokens (sequence parallel)

    def text(self, t: int) -> str:
        """The decision's ``share`` field for a group of ``t`` devices."""
        if self is Share.REPLICATED:
            return "replicated"
        if self is Share.TOKENS:
            return f"1/{t} of the tokens"
        return f"1/{t}"
