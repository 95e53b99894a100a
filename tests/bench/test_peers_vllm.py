"""vLLM as a peer (speczoo.bench.peers_vllm): the server's command line and environment, its start, answers
and stop against tests/fake_vllm_server.py in vLLM's place, and the family run serially by `run_peers`.

Tests marked `vllm` need vLLM's own venv (bash benchmarks/build_vllm.sh; SPECZOO_VLLM_VENV, default
/work/peers/vllm-venv) and are skipped with that reason without it: the speculators library loading a
speczoo head and computing its logits, and a real `vllm serve` of a tiny model in every mode."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from speczoo.bench import peers
from speczoo.bench.peers import PeerError, PeerPrompt, PeerSettings, run_peers, schedule, timed_tokens
from speczoo.bench.peers_vllm import (
    EAGLE_TOKENS, NGRAM_MAX, VllmFamily, VllmServer, VllmServerSpec, free_port, server_command, server_env,
    spec_counters, speculative_config, stream_completion)

FAKE = str(Path(__file__).parents[1] / "fake_vllm_server.py")
EOS = 7
VENV_ENV = "SPECZOO_VLLM_VENV"
REAL_VENV = Path(os.environ.get(VENV_ENV, "/work/peers/vllm-venv"))


def fake_venv(root: Path, iomp: bool = True) -> Path:
    """A folder shaped like a venv whose bin/python runs the fake server with the command line it gets."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib").mkdir()
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    python.chmod(0o755)
    if iomp:
        (venv / "lib" / "libiomp5.so").write_bytes(b"")
    return venv


def spec(venv: Path, **kw) -> VllmServerSpec:
    base = dict(venv=venv, model_dir=Path("/models/hf"), port=free_port(), threads=2, max_model_len=512, k=5,
                head=Path("/heads/h"))
    base.update(kw)
    return VllmServerSpec(**base)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:          # a zombie waiting for its parent counts as gone
        return f.read().split(") ")[-1][0] != "Z"


def starts(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


# -- the command line and the environment ----------------------------------------------------------

def test_server_command_is_the_api_server_module_with_greedy_defaults(tmp_path):
    s = spec(tmp_path / "v", mode="greedy", port=8123, dtype="float32")
    cmd = server_command(s)
    assert cmd[:3] == [str(tmp_path / "v" / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags["--model"] == "/models/hf" and flags["--port"] == "8123" and flags["--host"] == "127.0.0.1"
    assert flags["--dtype"] == "float32" and flags["--max-model-len"] == "512" and flags["--max-num-seqs"] == "1"
    assert flags["--generation-config"] == "vllm" and "--no-enable-prefix-caching" in cmd
    assert "--speculative-config" not in cmd
    assert server_command(spec(tmp_path, extra_args=("--enforce-eager",)))[-1] == "--enforce-eager"


def test_speculative_config_per_mode(tmp_path):
    ngram = server_command(spec(tmp_path, mode="ngram", k=6))
    assert json.loads(ngram[ngram.index("--speculative-config") + 1]) == {
        "method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1, "prompt_lookup_max": NGRAM_MAX}
    eagle = server_command(spec(tmp_path, mode="eagle3", head=Path("/heads/my-eagle")))
    assert json.loads(eagle[eagle.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": "/heads/my-eagle", "num_speculative_tokens": EAGLE_TOKENS}
    assert speculative_config(spec(tmp_path, mode="greedy")) is None
    with pytest.raises(PeerError, match="needs an EAGLE-3 head"):
        server_command(spec(tmp_path, mode="eagle3", head=None))
    with pytest.raises(PeerError, match="unknown vLLM mode 'medusa'"):
        server_command(spec(tmp_path, mode="medusa"))


def test_server_env_is_offline_bound_and_preloads_intel_openmp(tmp_path):
    venv = fake_venv(tmp_path)
    env = server_env(spec(venv, threads=2), base={"PATH": "/usr/bin", "PYTHONPATH": "/work/src", "LD_PRELOAD": "/x.so"})
    assert "PYTHONPATH" not in env and env["VIRTUAL_ENV"] == str(venv)
    assert env["PATH"].split(os.pathsep)[0] == str(venv / "bin")
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["LD_PRELOAD"].split(os.pathsep) == [str(venv / "lib" / "libiomp5.so"), "/x.so"]
    one = server_env(spec(fake_venv(tmp_path / "b", iomp=False), threads=1), base={"PATH": "/usr/bin"})
    assert one["VLLM_CPU_OMP_THREADS_BIND"] == "0" and "LD_PRELOAD" not in one


def test_spec_counters_sum_over_labels_and_default_to_zero():
    text = ('# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 51.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="t"} 9.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="t"} 12.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 7.0\n')
    assert spec_counters(text) == {"drafted": 60, "accepted": 12}
    assert spec_counters("vllm:num_requests_running 0.0\n") == {"drafted": 0, "accepted": 0}


def test_schedule_serial_runs_a_method_through_every_prompt_before_the_next():
    ps = [PeerPrompt(1, "a", "x", [1]), PeerPrompt(2, "b", "y", [2])]
    got = [(p.question_id, m, timed) for p, m, timed in schedule(["g", "n"], ps, serial=True, warm_up=True)]
    assert got == [(1, "g", False), (1, "g", True), (2, "g", True), (1, "n", False), (1, "n", True), (2, "n", True)]
    got = [(p.question_id, m, timed) for p, m, timed in schedule(["g", "n"], ps, serial=False, warm_up=True)]
    assert got == [(1, "g", False), (1, "n", False), (1, "g", True), (1, "n", True), (2, "g", True), (2, "n", True)]
    assert all(timed for _, _, timed in schedule(["g"], ps, serial=True, warm_up=False))
    assert peers.FAMILIES["vllm"].serial and not peers.FAMILIES["speczoo"].serial


# -- the server's life, against the fake --------------------------------------------------------------

def test_server_starts_answers_and_stops_its_whole_process_group(tmp_path, monkeypatch):
    import openai

    log = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    server = VllmServer(spec(fake_venv(tmp_path), mode="ngram"), log_path=tmp_path / "server.log", ready_timeout=30)
    url = server.start()
    try:
        assert url == f"http://127.0.0.1:{server.spec.port}/v1" and server.startup_seconds > 0.3
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        out = stream_completion(client, [3, 4, 5], 6, [EOS])
        assert out.ids == [100 + (12 + 7 * i) % 50 for i in range(6)] and out.finish == "length"
        assert out.tokens == 5 and out.timing == "first-token" and 0 <= out.seconds <= out.total_seconds
        stop = stream_completion(client, [999, 1], 6, [EOS, 8])        # the fake meets EOS as its 4th token
        assert stop.ids == [100 + (1000 + 7 * i) % 50 for i in range(3)] and stop.finish == "stop"
        assert stop.tokens == timed_tokens(3, "stop")
    finally:
        server.stop()
    (start,) = starts(log)
    assert "--speculative-config" in start["argv"] and start["env"]["PYTHONPATH"] is None
    assert start["env"]["HF_HUB_OFFLINE"] == "1"
    assert not alive(start["pid"]) and not alive(start["child"]), "a vLLM process outlived stop()"
    server.stop()                                     # a second stop is harmless


def test_a_server_that_exits_at_start_reports_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    server = VllmServer(spec(fake_venv(tmp_path)), log_path=tmp_path / "server.log", ready_timeout=30)
    with pytest.raises(PeerError, match=r"exited with status 3(.|\n)*cannot load this model"):
        server.start()
    assert server.proc is None


def test_a_server_that_never_answers_times_out_and_is_stopped(tmp_path, monkeypatch):
    log = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    monkeypatch.setenv("FAKE_VLLM_NEVER_READY", "1")
    server = VllmServer(spec(fake_venv(tmp_path)), log_path=tmp_path / "server.log", ready_timeout=1.5)
    with pytest.raises(PeerError, match="did not answer within 2 s"):
        server.start()
    (start,) = starts(log)
    assert not alive(start["pid"]) and not alive(start["child"])


def test_missing_venv_says_how_to_build_it(tmp_path):
    with pytest.raises(PeerError, match="build_vllm.sh"):
        VllmServer(spec(tmp_path / "nowhere")).start()
    settings = PeerSettings(target="t", target_gguf=Path("/m.gguf"), eos_ids=[EOS])
    with pytest.raises(PeerError, match="build_vllm.sh"):
        VllmFamily(settings)


def test_family_runs_its_methods_serially_one_server_at_a_time(tmp_path, monkeypatch):
    log = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))     # where the servers' logs go
    settings = PeerSettings(target="t", target_gguf=Path("/m.gguf"), eos_ids=[EOS], max_new_tokens=6, k=4,
                            warmup=2, n_ctx=256, vllm_venv=fake_venv(tmp_path), vllm_head=Path("/heads/h"))
    family = VllmFamily(settings, model_dir=tmp_path / "hf")
    prompts = [PeerPrompt(1, "code_edit", "a", [1, 2, 3]), PeerPrompt(2, "writing", "b", [999, 4])]
    out = run_peers(prompts, settings, tmp_path / "out", systems={"vllm": None}, families={"vllm": family},
                    baseline="vllm:greedy", quiet=True)
    assert [r["system"] for r in out.rows] == ["vllm:greedy"] * 2 + ["vllm:ngram"] * 2 + ["vllm:eagle3"] * 2
    assert all(r["lossless"] for r in out.rows if r["method"] != "greedy")
    assert [r["finish"] for r in out.rows[:2]] == ["length", "stop"]
    assert [(r["drafted"], r["accepted"]) for r in out.rows] == [(None, None)] * 2 + [(4, 3)] * 4
    runs = starts(log)
    modes = ["eagle3" if any('"eagle3"' in a for a in s["argv"]) else "ngram" if "--speculative-config" in s["argv"]
             else "greedy" for s in runs]
    assert modes == ["greedy", "ngram", "eagle3"], "each method's server starts once, in order"
    for earlier, later in zip(runs, runs[1:]):
        assert str(tmp_path / "hf") in later["argv"]
        assert not alive(earlier["child"]) and not alive(earlier["pid"])
    assert not any(alive(s["child"]) for s in runs)
    assert any("not the same weights" in line for line in out.markdown.splitlines())
    assert not list((tmp_path / "tmp").iterdir()), "a clean run leaves no server log behind"


# -- with vLLM's own venv ------------------------------------------------------------------------------

def need_venv() -> Path:
    if not (REAL_VENV / "bin" / "python").is_file():
        pytest.skip(f"vLLM's venv is not at {REAL_VENV}: build it with `bash benchmarks/build_vllm.sh` "
                    f"(or point {VENV_ENV} at one)")
    return REAL_VENV


@pytest.mark.vllm
@pytest.mark.slow
def test_speculators_loads_a_speczoo_head_and_computes_its_logits(tmp_path):
    """The head speczoo exports, read by the speculators library (config class and model class) in vLLM's
    venv, gives speczoo's logits on the same target features and tokens (benchmarks/speculators_check.py)."""
    import torch
    from safetensors.torch import save_file

    from speczoo.cache import KVCache
    from speczoo.decoding.eagle.config import HeadConfig
    from speczoo.decoding.eagle.head import EagleHead
    from speczoo.decoding.eagle.io import save_head

    venv = need_venv()
    cfg = HeadConfig(target="tiny", hidden_size=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96,
                     target_vocab=200, draft_vocab=120, aux_layer_ids=(1, 2, 3), rope_theta=1_000_000.0)
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(200, 64, generator=g)                                   # [V, D]
    head = EagleHead(cfg, embed, seed=1)
    head.set_vocab(torch.randperm(200, generator=g)[:120].sort().values)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
    save_head(head, tmp_path / "head")
    s = 12
    features = torch.randn(s, 3 * 64, generator=g)                             # [S, 3D]
    tokens = torch.randint(0, 200, (s,), generator=g)                          # [S]
    cache = KVCache(head.kv_args(), max_seq=s)
    ours = head.step(tokens, head.fuse(features), torch.arange(1, s + 1), cache).logits   # [S, Vd]
    save_file({"features": features, "tokens": tokens, "embed": embed}, str(tmp_path / "in.safetensors"))
    script = Path(__file__).parents[2] / "benchmarks" / "speculators_check.py"
    done = subprocess.run([str(venv / "bin" / "python"), str(script), str(tmp_path / "head"),
                           "--inputs", str(tmp_path / "in.safetensors"), "--out", str(tmp_path / "out.safetensors")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Eagle3SpeculatorConfig" in done.stdout and "draft_vocab_size 120" in done.stdout
    from safetensors.torch import load_file

    theirs = load_file(str(tmp_path / "out.safetensors"))
    assert torch.allclose(theirs["logits"], ours, atol=1e-4, rtol=1e-4), (theirs["logits"] - ours).abs().max()
    assert torch.equal(theirs["d2t"], head.d2t)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_serves_a_tiny_gguf_greedy_ngram_and_eagle3_losslessly(tmp_path):
    """A tiny qwen2 GGUF in the HF layout, served by vLLM in each mode: ngram's and EAGLE-3's answers equal
    vLLM's greedy ones (minutes: each start compiles the model)."""
    pytest.importorskip("transformers")
    import openai
    import torch
    from tiny_gguf import write_tiny_gguf

    from speczoo.bench.hf_layout import convert_gguf
    from speczoo.decoding.eagle.config import HeadConfig
    from speczoo.decoding.eagle.head import EagleHead
    from speczoo.decoding.eagle.io import save_head

    venv = need_venv()
    gguf, tensors = write_tiny_gguf(tmp_path / "t.gguf", "qwen2", dim=128, head_dim=32, n_heads=4, n_kv_heads=2,
                                    n_layers=4)
    model_dir = convert_gguf(gguf, tmp_path / "hf").path
    eos = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
    vocab = tensors["token_embd.weight"].shape[0]
    cfg = HeadConfig(target=str(model_dir), hidden_size=128, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=96,
                     target_vocab=vocab, draft_vocab=vocab, aux_layer_ids=(1, 2, 3), rope_theta=10_000.0)
    head = EagleHead(cfg, tensors["token_embd.weight"], seed=2)
    head.set_vocab(torch.arange(vocab))
    save_head(head, tmp_path / "head")
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    answers = {}
    for mode in ("greedy", "ngram", "eagle3"):
        server = VllmServer(VllmServerSpec(venv=venv, model_dir=model_dir, mode=mode, port=free_port(),
                                           max_model_len=256, k=4, head=tmp_path / "head", dtype="float32"),
                            log_path=tmp_path / f"{mode}.log")
        with server:
            client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=600)
            answers[mode] = stream_completion(client, prompt, 16, [eos]).ids
    assert answers["greedy"], "vLLM's greedy answered nothing"
    assert answers["ngram"] == answers["greedy"] and answers["eagle3"] == answers["greedy"]
