"""`train-eagle` end to end on a tiny random target, in seconds: features are cached, the loss falls,
a resumed run continues exactly where the checkpoint stopped, and the saved head loads and installs."""

import hashlib

import pytest
import torch

from speczoo.training.eagle.features import FeatureSet
from speczoo.decoding.eagle.io import load_head
from speczoo.training.eagle.pipeline import EagleTrainOptions, Target, train_eagle
from speczoo.training.eagle.train import TrainConfig
from speczoo.zoo.heads import find_head, heads_for
from speczoo.models.forward import Readout
from tiny import tiny_args, tiny_model, tiny_tensors

VOCAB = 128


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def tiny_target(name: str = "tiny-qwen") -> Target:
    model, args = tiny_model("qwen2", seed=3)
    tensors = tiny_tensors(args, seed=3)
    return Target(name=name, model=model, tensors=tensors,
                  encode=lambda text: [b % (VOCAB - 1) for b in text.encode()], separator=VOCAB - 1,
                  eos_ids=(VOCAB - 1,))


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    words = "def return self import class for in if else while yield lambda None True False".split()
    g = torch.Generator().manual_seed(0)
    for i in range(6):
        idx = torch.randint(0, len(words), (400,), generator=g).tolist()
        (d / f"f{i}.py").write_text(" ".join(words[j] for j in idx))
    return d


def options(out, corpus, steps, resume=False, name=None) -> EagleTrainOptions:
    return EagleTrainOptions(out=out, corpus=[corpus], max_tokens=64 * 30, seq_len=64, shard_seqs=4,
                             draft_vocab=100, name=name, resume=resume,
                             train=TrainConfig(steps=steps, batch=4, lr=3e-3, warmup=5, ttt_steps=3,
                                               checkpoint_every=5, progress=False))


def test_train_eagle_end_to_end(tmp_path, corpus, monkeypatch):
    monkeypatch.setenv("SPECZOO_HOME", str(tmp_path / "home"))
    target = tiny_target()
    rep = train_eagle(target, options(tmp_path / "run", corpus, steps=40, name="tiny-eagle"))
    assert rep.features.tokens == 64 * 30 and rep.features.new_tokens == 64 * 30   # 7 shards of 4, one of 2
    losses = rep.result.state.losses
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    # the installed head loads on the target's embedding and names its target
    entry = find_head("tiny-eagle")
    assert entry.target == "tiny-qwen" and [h.name for h in heads_for("tiny-qwen")] == ["tiny-eagle"]
    head = load_head(entry.path, target.model.embed)
    assert head.cfg.draft_vocab == 100 and int(head.t2d.sum()) == 100
    assert head.t2d[VOCAB - 1]                       # the end id is always in the draft vocabulary
    assert head.cfg.target_layers == (0, 0, 1)       # 3-layer target: vLLM ids (1, 1, 2)


def test_resume_continues_exactly(tmp_path, corpus):
    target = tiny_target()
    straight = train_eagle(target, options(tmp_path / "a", corpus, steps=10))
    part = train_eagle(target, options(tmp_path / "b", corpus, steps=5))
    assert part.result.state.step == 5
    with pytest.raises(ValueError, match="--resume"):
        train_eagle(target, options(tmp_path / "b", corpus, steps=10))
    resumed = train_eagle(target, options(tmp_path / "b", corpus, steps=10, resume=True))
    assert resumed.features.new_tokens == 0                        # the feature cache was reused
    assert resumed.result.steps_run == 5 and resumed.result.state.step == 10
    torch.testing.assert_close(torch.tensor(resumed.result.state.losses), torch.tensor(straight.result.state.losses),
                               rtol=1e-4, atol=1e-5)
    a = load_head(straight.head_dir, target.model.embed).state_dict()
    b = load_head(resumed.head_dir, target.model.embed).state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)


def test_feature_cache_refuses_other_layers(tmp_path, corpus):
    target = tiny_target()
    train_eagle(target, options(tmp_path / "a", corpus, steps=1))
    other, args = tiny_model("qwen2", seed=3, n_layers=5)
    t2 = Target(name="tiny-qwen", model=other, tensors=tiny_tensors(args, seed=3), encode=target.encode,
                separator=target.separator)
    with pytest.raises(ValueError, match="layers"):
        train_eagle(t2, options(tmp_path / "a", corpus, steps=2, resume=True))


def test_features_hold_the_targets_hidden_states(tmp_path, corpus):
    target = tiny_target()
    train_eagle(target, options(tmp_path / "a", corpus, steps=1))
    data = FeatureSet(tmp_path / "a" / "features")
    feats, ids, top1 = data.get([2])
    from speczoo.cache import KVCache
    out = target.model(ids[0], torch.arange(64), KVCache(target.model.args, 64),
                       readout=Readout(hidden_layers=(0, 0, 1)))
    torch.testing.assert_close(feats[0], torch.cat(out.hidden, -1).to(torch.bfloat16).float())
    assert torch.equal(top1[0], out.logits.argmax(-1))
    assert tiny_args("qwen2").dim * 3 == feats.shape[-1]


def test_prompts_are_answered_by_the_target_and_come_first(tmp_path, corpus):
    """--prompts: the target's answers (prompt + reply ids) are chunked before the corpus; with no
    corpus they are the only data; the cache's digest tells prompt sets apart; bad prompt files fail."""
    from speczoo.training.eagle.answers import read_prompts
    from speczoo.training.eagle.features import chunk_stream
    from speczoo.training.eagle.pipeline import training_chunks

    assert list(chunk_stream([[1, 2, 3], [4, 5]], 3, separator=0)) == [[1, 2, 3], [0, 4, 5]]
    asked: list[str] = []

    def answer(convs: list[list[str]], max_tokens: int) -> list[list[int]]:
        assert max_tokens == 256 and all(len(c) == 1 for c in convs)
        asked.extend(c[0] for c in convs)
        return [[7] * 40 + [8] * 40 for _ in convs]     # conversations of 80 ids
    target = tiny_target()
    target.answer = answer
    opts = options(tmp_path / "run", corpus, steps=1)
    opts.prompts, opts.answer_batch = ["first", "second", "third"], 1
    chunks, digest = training_chunks(target, opts)
    first = next(chunks)
    assert first[:40] == [7] * 40 and asked == ["first"]          # answered lazily, first prompt first
    rest = list(chunks)
    assert len(rest) > 3 and asked == ["first", "second", "third"] and digest.startswith("prompts:")
    asked.clear()
    opts.out, opts.answer_batch = tmp_path / "grouped", 2         # two prompts per packed decode
    chunks, grouped_digest = training_chunks(target, opts)
    next(chunks)
    assert asked == ["first", "second"] and grouped_digest == digest   # the same text: the same cache
    list(chunks)
    assert asked == ["first", "second", "third"]
    opts.answer_batch = 0
    with pytest.raises(ValueError, match="groups of at least 1"):
        training_chunks(target, opts)
    opts.prompts = ["first", "second"]
    only = EagleTrainOptions(out=tmp_path / "x", prompts=["first", "second"], seq_len=64)
    only_chunks, only_digest = training_chunks(target, only)
    assert len(list(only_chunks)) == (2 * 81) // 64 and "+" not in only_digest
    other = EagleTrainOptions(out=tmp_path / "x", prompts=["first"], seq_len=64)
    assert training_chunks(target, other)[1] != only_digest
    longer = EagleTrainOptions(out=tmp_path / "x", prompts=["first", "second"], seq_len=64, answer_tokens=512)
    assert training_chunks(target, longer)[1] != only_digest       # other answers: another cache
    target.answer = None
    with pytest.raises(ValueError, match="answers"):
        training_chunks(target, only)
    f = tmp_path / "p.txt"
    f.write_text('plain line\n\n{"prompt": "json prompt"}\n{"question_id": 1, "turns": ["a turn", "b"]}\n')
    assert read_prompts(f) == ["plain line", "json prompt", "a turn"]
    f.write_text("\n\n")
    with pytest.raises(ValueError, match="no prompts"):
        read_prompts(f)
    for bad, why in (('{"prompt": 3}', "field of text"), ('{"turns": []}', "field of text"),
                     ("{not json", "not a JSON object")):
        f.write_text("fine\n" + bad + "\n")
        with pytest.raises(ValueError, match=f"p.txt:2: .*{why}"):
            read_prompts(f)


def test_train_eagle_on_answers_end_to_end(tmp_path, corpus):
    target = tiny_target()
    g = torch.Generator().manual_seed(1)
    target.answer = lambda convs, n: [torch.randint(0, 60, (200,), generator=g).tolist() for _ in convs]
    opts = options(tmp_path / "run", corpus, steps=10)
    opts.corpus, opts.prompts = None, [f"p{i}" for i in range(12)]
    rep = train_eagle(target, opts)
    assert rep.features.tokens == 64 * 30 and len(rep.result.state.losses) == 10
    assert FeatureSet(tmp_path / "run" / "features").manifest.corpus.startswith("prompts:")


def test_the_shipped_chat_prompts_are_many_distinct_and_not_the_benchmarks():
    """`train-eagle --prompts builtin`: ~300 distinct chat requests, none of them a benchmark prompt or
    question (a head trained on those would flatter every figure measured with them)."""
    from speczoo.bench.prompts import BUILTIN_PROMPTS
    from speczoo.bench.questions import builtin_questions
    from speczoo.training.eagle.answers import builtin_prompts, read_prompts

    prompts = read_prompts(builtin_prompts())
    assert len(prompts) >= 300 and len(set(prompts)) == len(prompts)
    bench = [p.message for p in BUILTIN_PROMPTS] + [t for q in builtin_questions() for t in q.turns]
    words = {p: set(p.lower().split()) for p in prompts}
    for b in bench:
        bw = set(b.lower().split())
        assert b not in prompts and all(len(bw & w) < 0.8 * len(w) for w in words.values()), b[:80]
    kinds = ("story", "Explain", "essay", "email", "tips", "poem", "Python function", "code")
    assert all(sum(k in p for p in prompts) >= 5 for k in kinds)


def test_a_resumed_run_reads_the_answers_back_instead_of_generating_them(tmp_path, corpus):
    """The answers are the dear part of a CPU run: each is logged when generated (answers.jsonl) and a
    resumed extraction, which re-walks the chunk stream up to its first missing shard, reads them back."""
    target = tiny_target()
    asked: list[str] = []

    def answer(convs: list[list[str]], max_tokens: int) -> list[list[int]]:
        asked.extend(c[0] for c in convs)
        return [[hash(c[0]) % 60] * 150 for c in convs]
    target.answer = answer
    opts = options(tmp_path / "run", corpus, steps=2)
    opts.corpus, opts.prompts, opts.max_tokens = None, [f"p{i}" for i in range(16)], 64 * 12
    opts.answer_batch = 4
    train_eagle(target, opts)
    # 12 chunks of 64 need 6 answers of 150 ids (+ a separator each): two groups of 4 prompts
    assert asked == [f"p{i}" for i in range(8)]
    asked.clear()
    opts.resume, opts.max_tokens, opts.train.steps = True, 64 * 24, 3
    rep = train_eagle(target, opts)
    # 24 chunks need 11 answers: p0-p7 are read back from the log, the third group is answered
    assert rep.features.new_tokens == 64 * 12 and asked == [f"p{i}" for i in range(8, 12)]


def test_the_answer_log_cuts_a_torn_line_and_keys_on_the_answer_length(tmp_path):
    from speczoo.training.eagle.answers import AnswerLog

    calls: list[list[str]] = []

    def answer(cs: list[list[str]], ids=None) -> list[list[int]]:
        calls.append([c[0] for c in cs])
        return [ids or [1, 2, len(c[0]), len(c)] for c in cs]
    log = AnswerLog(tmp_path / "a.jsonl", answer, max_tokens=8)
    assert log([["ab"]]) == [[1, 2, 2, 1]] and log([["ab"]]) == [[1, 2, 2, 1]] and calls == [["ab"]]
    # only the conversations not logged are answered, together and once each
    assert log([["ab"], ["xyz"], ["xyz"], ["q"], ["q", "more"]]) == [[1, 2, 2, 1], [1, 2, 3, 1], [1, 2, 3, 1],
                                                                    [1, 2, 1, 1], [1, 2, 1, 2]]
    assert calls == [["ab"], ["xyz", "q", "q"]]
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write('{"key": "x", "ids": [1, ')                  # interrupted mid-append
    again = AnswerLog(tmp_path / "a.jsonl", lambda cs: answer(cs, [9]), max_tokens=8)
    assert again([["ab"], ["q", "more"]]) == [[1, 2, 2, 1], [1, 2, 1, 2]] and len(calls) == 2
    assert again([["cd"]]) == [[9]] and AnswerLog(tmp_path / "a.jsonl", None, 8).known == again.known
    assert AnswerLog(tmp_path / "a.jsonl", lambda cs: [[5]], max_tokens=16)([["ab"]]) == [[5]]   # another length
    # a one-turn conversation keeps the key a prompt had before follow-ups existed (old logs stay valid)
    assert log.key(["ab"]) == hashlib.sha256(b"8\0ab").hexdigest()[:24]
    with pytest.raises(ValueError, match="asked for 2 answers, got 1"):
        AnswerLog(tmp_path / "b.jsonl", lambda cs: [[5]], max_tokens=8)([["u"], ["v"]])


def test_follow_ups_make_multi_turn_conversations(tmp_path):
    """--follow-ups N: each prompt gets N distinct generic requests after it, the same ones every time
    (so the answer log and the feature cache stay valid), and the cache's digest names N."""
    from speczoo.training.eagle.answers import FOLLOW_UPS, conversations
    from speczoo.training.eagle.pipeline import training_chunks

    convs = conversations(["a", "b", "c"], 3)
    assert [c[0] for c in convs] == ["a", "b", "c"] and all(len(set(c)) == 4 for c in convs)
    assert all(t in FOLLOW_UPS for c in convs for t in c[1:]) and conversations(["a", "b", "c"], 3) == convs
    assert len({tuple(c[1:]) for c in conversations([f"p{i}" for i in range(20)], 2)}) > 5
    assert conversations(["a"], 0) == [["a"]]
    with pytest.raises(ValueError, match="follow-ups"):
        conversations(["a"], len(FOLLOW_UPS) + 1)
    target = tiny_target()
    seen: list[list[str]] = []
    target.answer = lambda cs, n: seen.extend(cs) or [[3] * 70 for _ in cs]
    plain = EagleTrainOptions(out=tmp_path / "plain", prompts=["a", "b"], seq_len=64)
    more = EagleTrainOptions(out=tmp_path / "more", prompts=["a", "b"], seq_len=64, follow_ups=2)
    assert training_chunks(target, plain)[1] != training_chunks(target, more)[1]
    next(training_chunks(target, more)[0])
    assert [len(c) for c in seen] == [3, 3]


def test_held_out_chunks_are_spread_over_the_cache_and_optional():
    from speczoo.training.eagle.holdout import split
    train_idx, held = split(45, 20)
    assert held == [19, 39] and sorted(train_idx + held) == list(range(45))
    assert split(45, 0) == (list(range(45)), []) and split(19, 20) == (list(range(19)), [])
    with pytest.raises(ValueError, match="held-out"):
        split(45, -1)


def test_the_head_is_judged_and_calibrated_on_chunks_it_never_trained_on(tmp_path, corpus, monkeypatch):
    from safetensors import safe_open

    from speczoo.training.eagle.holdout import TEMPERATURES, calibrate, judge
    from speczoo.training.eagle.train import CHECKPOINT

    seen: list[int] = []
    real_get = FeatureSet.get

    def spy(self, index):
        seen.extend(index)
        return real_get(self, index)

    monkeypatch.setattr(FeatureSet, "get", spy)
    target = tiny_target()
    rep = train_eagle(target, options(tmp_path / "run", corpus, steps=40))        # 30 chunks: chunk 19 held out
    held = rep.held_out
    assert held is not None and held.rows == 63 and len(held.top1) == 3 and held.temperature in TEMPERATURES
    assert seen.count(19) == 1                        # read once, by the judge: never a training batch
    assert all(0.0 <= a <= 1.0 for a in held.top1 + held.confidence)
    # the saved head is the checkpoint's (uncalibrated, for --resume) with its LM head at the temperature
    saved = load_head(rep.head_dir, target.model.embed)
    ckpt = load_head(tmp_path / "run" / CHECKPOINT / "head", target.model.embed)
    torch.testing.assert_close(saved.lm_head.weight, ckpt.lm_head.weight / held.temperature)
    with safe_open(str(rep.head_dir / "model.safetensors"), framework="pt") as f:
        assert float(f.metadata()["temperature"]) == pytest.approx(held.temperature, abs=1e-4)
    # a head made three times as sure of itself is told to cool down by about three
    data = FeatureSet(tmp_path / "run" / "features")
    base = judge(ckpt, data, [19], 3)
    calibrate(ckpt, 1 / 3)
    hot = judge(ckpt, data, [19], 3)
    assert hot.top1 == base.top1                      # the argmax, so every greedy proposal, is unchanged
    assert hot.temperature == pytest.approx(3 * base.temperature, rel=0.06)
    assert judge(ckpt, data, [], 3) is None


def test_without_held_out_chunks_the_head_is_saved_as_trained(tmp_path, corpus):
    target = tiny_target()
    opts = options(tmp_path / "run", corpus, steps=3)
    opts.train.holdout_every = 0
    rep = train_eagle(target, opts)
    assert rep.held_out is None
    saved = load_head(rep.head_dir, target.model.embed)
    ckpt = load_head(tmp_path / "run" / "checkpoint" / "head", target.model.embed)
    torch.testing.assert_close(saved.lm_head.weight, ckpt.lm_head.weight)


def test_a_larger_cache_serves_the_first_tokens_asked_for(tmp_path, corpus, monkeypatch):
    target = tiny_target()
    train_eagle(target, options(tmp_path / "run", corpus, steps=1))              # 30 chunks cached
    seen: list[int] = []
    real_get = FeatureSet.get
    monkeypatch.setattr(FeatureSet, "get", lambda self, index: seen.extend(index) or real_get(self, index))
    opts = options(tmp_path / "run", corpus, steps=30, resume=True)
    opts.max_tokens = 64 * 22                                                      # chunks 0..21; 19 held out
    rep = train_eagle(target, opts)
    assert rep.features.new_tokens == 0 and rep.held_out.rows == 63
    assert max(seen) == 21 and seen.count(19) == 1
