"""The one annotated graph every stage reads, and the records the stages write.

``graph`` (the IR both frontends produce), ``ops`` (the canonical op vocabulary), ``plan`` (the
frozen per-node analysis, cost and decisions), ``shape_range`` (dims between min and max),
``options`` (the user's choices), ``order`` (a stable topological order) and ``legality`` (may a
rewrite run here, and why not).
"""
