"""Reading a plan's JSON back: the round trip the plan-record tests share."""

from __future__ import annotations

from dataclasses import fields

from graphopt.ir.plan import Plan


def differences(a: Plan, b: Plan) -> list[str]:
    """The plan fields (and for nodes, the first node's fields) that differ: a readable failure."""
    out = [f.name for f in fields(Plan) if f.compare and getattr(a, f.name) != getattr(b, f.name)]
    for x, y in zip(a.nodes, b.nodes, strict=True):
        if x != y:
            out += [f"{x.name}.{f.name}" for f in fields(x)
                    if getattr(x, f.name) != getattr(y, f.name)]
            break
    return out


def round_trip(p: Plan) -> Plan:
    """``p`` written as JSON and read back: it must equal ``p`` and write the same text."""
    text = p.to_json()
    back = Plan.from_json(text)
    assert back == p, differences(p, back)
    assert back.to_json() == text
    return back
