"""The command outputs README.md quotes match what the commands print now (tests/readme_check.py).

A failure lists each README line beside the command's current line: fix the README (or the
regression) so that they agree.
"""

from __future__ import annotations

import pytest

from tests.readme_check import _compare_block, _quoted_blocks, check


@pytest.mark.slow  # ~50 s on 2 shared cores: a 7B trace on meta (llm_decode part 1) and make demo
def test_readme_outputs_match_the_commands() -> None:
    found = check()
    assert not found, "README outputs drifted:\n" + "\n".join(map(str, found))


def test_a_drifted_quote_is_reported_with_both_versions() -> None:
    out = ["title", "7B Llama on h100: 64.0 GiB at batch 64; largest batch 56",
           "decode  batch  tokens/s", "            1        77", "           64       754"]
    quoted = ["7B Llama on h100: 64.0 GiB at", "batch 64; largest batch 56",
              "decode  batch  tokens/s", "           64       755"]
    found = _compare_block("cmd", 10, quoted, out)
    assert [(m.readme_line, m.readme, m.now) for m in found] == [(13, "64 755", "64 754")]
    assert not _compare_block("cmd", 10, quoted[:3], out)  # wrapped line, skipped rows


def test_every_text_block_needs_a_marker() -> None:
    text = "x\n\n```text\n1 2\n```\n\n<!-- readme-check: make demo -->\n```text\na\n```\n"
    blocks, unmarked = _quoted_blocks(text)
    assert unmarked == [3] and blocks == [("make demo", 9, ["a"])]
