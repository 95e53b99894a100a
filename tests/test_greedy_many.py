"""Greedy decoding of many prompts at once (speczoo/greedy_many.py): several prompts decoded side by side in one cache give
exactly what each gives alone, on a tiny model and on the real 0.5B with its compiled kernels."""

import pytest
import torch

from speczoo.cache import KVCache
from speczoo.request import GenerationRequest
from speczoo.kernels.attention import KeyRows
from speczoo.greedy_many import greedy_many
from tiny import tiny_model

INVARIANT = "fp32-rows"


def alone(model, prompt: list[int], n: int, ends=()) -> list[int]:
    """The obviously-correct loop: prefill, then one token per forward."""
    cache = KVCache(model.args, len(prompt) + n + 1)
    with torch.no_grad():
        logits = model(torch.tensor(prompt), torch.arange(len(prompt)), cache, logit_rows=slice(-1, None)).logits
        out = [int(logits[0].argmax())]
        while len(out) < n and out[-1] not in ends:
            pos = len(prompt) + len(out) - 1
            out.append(int(model(torch.tensor(out[-1:]), torch.tensor([pos]), cache).logits[0].argmax()))
    return out


def test_many_at_once_equals_each_prompt_alone():
    model, args = tiny_model("qwen2", backend=INVARIANT, seed=7)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, args.vocab_size, (n,), generator=g).tolist() for n in (5, 1, 17, 9)]
    got = greedy_many(model, prompts, 12)
    assert got == [alone(model, p, 12) for p in prompts]
    assert all(len(o) == 12 for o in got)


def test_sequences_stop_at_their_own_end():
    """A sequence that emits an end id stops there (the id left out, as the engine reports it) while
    the others go on."""
    model, args = tiny_model("qwen2", backend=INVARIANT, seed=7)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, args.vocab_size, (6,), generator=g).tolist() for _ in range(3)]
    free = greedy_many(model, prompts, 10)
    end = free[1][3]                                            # make sequence 1's fourth id an end id
    got = greedy_many(model, prompts, 10, eos_ids=[end])
    for p, f, o in zip(prompts, free, got):
        cut = f.index(end) if end in f else len(f)
        assert o == f[:cut] == [t for t in alone(model, p, 10, ends={end}) if t != end]
    assert len(got[1]) <= 3


def test_rows_see_only_their_own_sequence():
    """The explicit keys really isolate the sequences: a row fed another sequence's slots differs."""
    model, args = tiny_model("qwen2", backend=INVARIANT, seed=7)
    a, b = [3, 9, 27, 81 % 128], [5, 25, 125, 1]
    cache = KVCache(args, 16)
    with torch.no_grad():
        model(torch.tensor(a + b), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]), cache,
              keys=KeyRows.from_rows([(0, i + 1) for i in range(4)] + [(4, 5 + i) for i in range(4)]))
        own = model(torch.tensor([7]), torch.tensor([4]), cache,
                    keys=KeyRows.from_rows([torch.tensor([4, 5, 6, 7, 8])])).logits
        cache.truncate(8)
        mixed = model(torch.tensor([7]), torch.tensor([4]), cache,
                      keys=KeyRows.from_rows([torch.tensor([0, 1, 2, 3, 8])])).logits
    ref = KVCache(args, 8)
    with torch.no_grad():
        model(torch.tensor(b), torch.arange(4), ref)
        want = model(torch.tensor([7]), torch.tensor([4]), ref).logits
    assert torch.equal(own, want) and not torch.equal(mixed, want)


def test_bad_input():
    model, args = tiny_model("qwen2", backend=INVARIANT)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_many(model, [[1, 2]], 0)
    with pytest.raises(ValueError, match="at least one token"):
        greedy_many(model, [[1], []], 4)
    assert greedy_many(model, [], 4) == []
    cache = KVCache(args, 8)
    with pytest.raises(ValueError, match="not both"):
        model(torch.tensor([1, 2]), torch.arange(2), cache, tree_mask=torch.ones(2, 2, dtype=torch.bool),
              keys=KeyRows.from_rows([(0, 1), (0, 2)]))
    with pytest.raises(ValueError, match="rows"):
        model(torch.tensor([1, 2]), torch.arange(2), cache, keys=KeyRows.from_rows([(0, 1)]))
    gemma, _ = tiny_model("gemma3", backend=INVARIANT)
    with pytest.raises(ValueError, match="sliding-window"):
        greedy_many(gemma, [[1, 2]], 3)


def test_real_model_packed_equals_engine_greedy():
    """The 0.5B with its compiled q4 kernels: four chat prompts packed give the engine's plain greedy
    output for each, token for token."""
    from real_models import real_runtime
    rt = real_runtime()
    texts = ["Write a haiku about rain.", "What is 17 * 23?", "Name three prime numbers.",
             "Say hello in French."]
    prompts = [rt.chat_ids([{"role": "user", "content": t}]) for t in texts]
    got = greedy_many(rt.target.model, prompts, 24, eos_ids=rt.tokenizer.eos_ids)
    for p, o in zip(prompts, got):
        *_, done = rt.generate(GenerationRequest(prompt_ids=p, max_new_tokens=24, spec="off"))
        assert o == done.ids


def test_train_eagle_answers_are_the_engine_greedy_conversations():
    """`train-eagle --prompts`' answerer: each conversation's turns through the chat template, each
    followed by plain greedy's reply to the conversation so far (the earlier replies as text, as a chat
    client sends them), for conversations of different lengths packed together (the real 0.5B)."""
    from real_models import real_runtime
    from speczoo.commands.train_eagle import answerer
    rt = real_runtime()
    convs = [["Write a limerick about a cat.", "Make it about a dog instead."], ["List two colours."]]
    got = answerer(rt.target)(convs, 16)
    for turns, conv in zip(convs, got):
        messages: list[dict] = []
        for t in turns:
            messages.append({"role": "user", "content": t})
            p = rt.chat_ids(messages)
            *_, done = rt.generate(GenerationRequest(prompt_ids=p, max_new_tokens=16, spec="off"))
            messages.append({"role": "assistant", "content": rt.tokenizer.decode(done.ids)})
        assert conv == p + done.ids
    assert len(got[0]) > len(got[1]) + 20
