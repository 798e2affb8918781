"""Prompts re-rendered after a split stand on the raw text each reply was sampled as, even when
two replies look the same to the client. The engine's words are scripted (the tokenizer,
renderer, HTTP stack and `openai` client are real)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai

from conveyor.engines.simulated import SimulatedEngine

# Both show the client "Thinking." (the visible content is stripped), but the model wrote
# different text: a prompt must carry each as it was sampled.
RAW = ["Thinking.\n\n", "  Thinking."]


def _scripted_engine(tokenizer: Any, texts: list[str]) -> SimulatedEngine:
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    replies: Iterator[str] = iter(texts)
    return SimulatedEngine(
        lambda _prompt: tokenizer.encode(next(replies), add_special_tokens=False) + end,
        eos_token_id=end[0],
    )


def test_split_rerenders_each_visually_identical_reply_from_its_own_raw_text(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    gateway = make_gw(_scripted_engine(tokenizer, [*RAW, "Done."]))
    with serve(gateway) as url:
        client = openai.OpenAI(base_url=f"{url}/rollouts/r1/v1", api_key="x", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Think."}]
        for _ in RAW:
            reply = client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            assert reply.choices[0].message.content == "Thinking."
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "user", "content": "Go on."})
        assert messages[1] == messages[3]  # the client cannot tell the two replies apart
        # an edit of the first message: the whole conversation is rendered again
        edited = [{"role": "user", "content": "Think hard."}, *messages[1:]]
        client.chat.completions.create(model="m", messages=edited)  # type: ignore[arg-type]

    recorded = gateway.trajectory("r1")
    assert recorded.counters["splits"] == 1
    assert [t.sample_index for t in recorded.turns] == [0, 0, 1]
    sampled = [tokenizer.decode(t.completion_ids) for t in recorded.turns[:2]]
    assert [s.removesuffix("<|im_end|>") for s in sampled] == RAW
    renderer = gateway.make_renderer([])
    expected = renderer.render(
        [
            {"role": "user", "content": "Think hard."},
            {"role": "assistant", "content": RAW[0]},
            {"role": "user", "content": "Go on."},
            {"role": "assistant", "content": RAW[1]},
            {"role": "user", "content": "Go on."},
        ],
        add_generation_prompt=True,
    )
    assert recorded.turns[2].prompt_ids == renderer.encode(expected)


def test_reply_found_off_the_returned_path_by_order_of_sampling(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    """A client that drops a message before the replies (so no returned conversation holds
    them) still gets each reply's own raw text, matched in the order they were sampled."""
    gateway = make_gw(_scripted_engine(tokenizer, [*RAW, "Done."]))
    with serve(gateway) as url:
        client = openai.OpenAI(base_url=f"{url}/rollouts/r2/v1", api_key="x", max_retries=0)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Think."},
        ]
        for _ in RAW:
            reply = client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "user", "content": "Go on."})
        client.chat.completions.create(model="m", messages=messages[1:])  # type: ignore[arg-type]

    last = gateway.trajectory("r2").turns[-1]
    renderer = gateway.make_renderer([])
    expected = renderer.render(
        [
            {"role": "user", "content": "Think."},
            {"role": "assistant", "content": RAW[0]},
            {"role": "user", "content": "Go on."},
            {"role": "assistant", "content": RAW[1]},
            {"role": "user", "content": "Go on."},
        ],
        add_generation_prompt=True,
    )
    assert last.sample_index == 1
    assert last.prompt_ids == renderer.encode(expected)
