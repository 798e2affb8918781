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


def _split_once(client: openai.OpenAI) -> tuple[Any, Any]:
    """Two turns, then the first message edited: (the second reply's raw HTTP response, the
    split reply's)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Think."}]
    first = client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "Go on."},
    ]
    kept = client.chat.completions.with_raw_response.create(model="m", messages=messages)  # type: ignore[arg-type]
    edited = [{"role": "user", "content": "Think hard."}, *messages[1:]]
    split = client.chat.completions.with_raw_response.create(model="m", messages=edited)  # type: ignore[arg-type]
    return kept, split


def test_splits_are_reported_and_a_rollout_may_drop_the_samples_they_closed(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    import httpx

    from conveyor.config import AgentConfig

    gateway = make_gw(_scripted_engine(tokenizer, [*RAW, "Done."] * 3))
    dropping = make_gw(
        _scripted_engine(tokenizer, [*RAW, "Done."]),
        agent=AgentConfig(max_completion_tokens=48, split_samples="drop"),
    )
    with serve(gateway) as url, serve(dropping) as drop_url:
        http = httpx.Client(base_url=url)
        assert http.post("/rollouts", json={"rollout_id": "d", "split_samples": "drop"}).is_success
        bad = http.post("/rollouts", json={"rollout_id": "x", "split_samples": "maybe"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "split_samples"
        for rollout, base in [("t", url), ("d", url), ("c", drop_url)]:
            client = openai.OpenAI(
                base_url=f"{base}/rollouts/{rollout}/v1", api_key="x", max_retries=0
            )
            kept, split = _split_once(client)
            assert kept.headers["x-conveyor-splits"] == "0" and "x-conveyor-split" not in (
                kept.headers
            )
            assert split.headers["x-conveyor-splits"] == "1"
            assert split.headers["x-conveyor-sample-index"] == "1"
            assert "resent history differs" in split.headers["x-conveyor-split"]
        shown = http.get("/rollouts/t")
        assert shown.headers["x-conveyor-splits"] == "1"
        notes = [m["content"] for m in shown.json()["messages"] if m["role"] == "split"]
        assert len(notes) == 1 and "resent history differs" in notes[0]

    trained = gateway.trajectory("t")
    assert [sum(s.loss_mask) > 0 for s in trained.samples()] == [True, True]
    for dropped in (gateway.trajectory("d"), dropping.trajectory("c")):
        assert dropped.counters["dropped_split_turns"] == 2
        assert [sum(s.loss_mask) > 0 for s in dropped.samples()] == [False, True]
        # the dropped turns are still recorded, ids and logprobs as sampled
        assert [t.completion_ids for t in dropped.turns] == [
            t.completion_ids for t in trained.turns
        ]
