"""A tiny builder of graphopt IR graphs for tests that must not depend on a frontend."""

from __future__ import annotations

from graphopt.ir.graph import Graph, Node, TensorInfo


class G:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.tensors: dict[str, TensorInfo] = {}
        self.inputs: list[str] = []

    def input(self, name: str, shape, dtype: str = "fp32") -> str:
        self.tensors[name] = TensorInfo(name, tuple(shape), dtype, "input")
        self.inputs.append(name)
        return name

    def param(self, name: str, shape, dtype: str = "fp32", kind: str = "param") -> str:
        self.tensors[name] = TensorInfo(name, tuple(shape), dtype, kind)  # type: ignore[arg-type]
        return name

    def op(self, op_type: str, inputs: list[str], shape, dtype: str = "fp32",
           name: str | None = None, **attrs) -> str:
        name = name or f"{op_type.lower()}_{len(self.nodes)}"
        self.tensors[name] = TensorInfo(name, None if shape is None else tuple(shape), dtype)
        self.nodes.append(Node(name, op_type, op_type, list(inputs), [name], dict(attrs)))
        return name

    def build(self, outputs: list[str]) -> Graph:
        return Graph("test", "onnx", self.nodes, self.tensors, self.inputs, outputs)
