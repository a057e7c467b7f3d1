"""The torch backend: the plan's decisions as fx edits on an exported graph (``pipeline``), the
:class:`OptimizedModule` it returns, and its ``.pt2`` file (``saved``, ``pt2_reader``)."""
