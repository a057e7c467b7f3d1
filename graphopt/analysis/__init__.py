"""Analysis passes: kernel class, dims, FLOPs and bytes of every node."""

from __future__ import annotations

from graphopt.analysis.annotate import annotate
from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.analysis.patterns import PatternMatch, find_patterns
from graphopt.analysis.record import NodeAnalysis

__all__ = ["GEMM_LIKE", "KernelClass", "NodeAnalysis", "PatternMatch", "annotate", "find_patterns"]
