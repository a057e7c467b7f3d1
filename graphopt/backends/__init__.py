"""Backends apply the plan's decisions to a model: ``torch/`` as fx edits, ``onnx/`` as ONNX edits.

``driver`` runs their passes in one loop (apply, check the numbers, time, keep or revert);
``timing`` compares two runs interleaved. A backend answers only "can I apply this here" and
makes the edits: what to do is decided in ``graphopt/decisions``.
"""
