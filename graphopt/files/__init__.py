"""The files a command reads (``inputs``) and writes (``outputs``: one checked set, written whole
or not at all, never over an input), and how a model held in memory reaches ONNX Runtime
without its weights serialized (``ort_load``, ``proto_copy``)."""
