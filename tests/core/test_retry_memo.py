"""The answer memo's bounds: entries, bytes, and how many ``RunAgent`` scopes a process keeps."""

from __future__ import annotations

from beam_agents.core.model_calls import MEMO_MAX_SCOPES, AnswerMemo, ProviderAnswer, answer_memo
from beam_agents.model.client import LlmResponse


def _answer(size: int) -> ProviderAnswer:
    return ProviderAnswer(LlmResponse(response=b"x" * size), attempts=1)


def test_the_oldest_answers_go_first_past_the_entry_and_byte_bounds() -> None:
    memo: AnswerMemo[ProviderAnswer] = AnswerMemo(max_entries=2, max_bytes=10)
    memo.put("a", _answer(4))
    memo.put("b", _answer(4))
    memo.put("c", _answer(4))  # three entries, 12 bytes: "a" goes
    assert memo.get("a") is None and memo.get("b") is not None and len(memo) == 2
    memo.put("d", _answer(9))  # 13 bytes with "c": "b" and "c" go
    assert [key for key in "abcd" if memo.get(key) is not None] == ["d"]
    memo.put("huge", _answer(11))  # larger than the whole memo: not kept
    assert memo.get("huge") is None and memo.get("d") is not None


def test_a_process_keeps_the_memos_of_its_most_recent_run_agents() -> None:
    first = answer_memo("scope-first")
    assert answer_memo("scope-first") is first
    for n in range(MEMO_MAX_SCOPES):
        answer_memo(f"scope-{n}")
    assert answer_memo("scope-first") is not first
