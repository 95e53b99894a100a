"""Reads an EAGLE-3 head with the `speculators` library's own classes, as vLLM's users do: run it with the
Python of vLLM's venv (bash benchmarks/build_vllm.sh), never speczoo's; it imports nothing from speczoo.

    VENV/bin/python benchmarks/speculators_check.py HEAD_DIR [--inputs IN.safetensors --out OUT.safetensors]

Prints what `Eagle3SpeculatorConfig.from_pretrained` read (the layer config, draft vocabulary, feature
layers, proposal method, verifier), builds `Eagle3DraftModel` from that config and loads the head's
model.safetensors into it, refusing any tensor it does not know or any it needs and did not get (only the
verifier's own tensors may be absent: embed_tokens, verifier_norm, verifier_lm_head). With --inputs
(features [S, 3D], tokens [S], the target's embed [V, D]) it runs the model's first training-time-test
step over the S rows (row r: feature of r, token of r + 1, causal) and writes the draft-vocabulary logits
[S, Vd] and d2t to --out, for tests/bench/test_peers_vllm.py to compare with speczoo's own head.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VERIFIER_TENSORS = {"embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("head", type=Path)
    p.add_argument("--inputs", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if bool(args.inputs) != bool(args.out):
        p.error("--inputs and --out go together")

    from importlib.metadata import version

    import torch
    from safetensors.torch import load_file, save_file
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(args.head))
    layer = config.transformer_layer_config
    spec = config.speculators_config
    print(f"speculators {version('speculators')}: "
          f"{type(config).__name__} from {args.head}")
    print(f"  transformer_layer_config {type(layer).__name__}: hidden_size {layer.hidden_size}, "
          f"layers {layer.num_hidden_layers}, heads {layer.num_attention_heads}/{layer.num_key_value_heads}, "
          f"intermediate_size {layer.intermediate_size}, vocab_size {layer.vocab_size}")
    print(f"  draft_vocab_size {config.draft_vocab_size}, target_hidden_size {config.target_hidden_size}, "
          f"eagle_aux_hidden_state_layer_ids {config.eagle_aux_hidden_state_layer_ids}, "
          f"norm_before_residual {config.norm_before_residual}")
    print(f"  speculators_config: algorithm {spec.algorithm}, proposal {spec.default_proposal_method} "
          f"({spec.proposal_methods[0].speculative_tokens} tokens), verifier {spec.verifier.name_or_path!r}")

    layer._attn_implementation = "eager"          # flex attention (the library's default) wants a compiler
    model = Eagle3DraftModel(config).float().eval()
    state = load_file(str(args.head / "model.safetensors"))
    expected = set(model.state_dict())
    missing = sorted(expected - set(state) - VERIFIER_TENSORS)
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        print(f"error: the head's tensors do not fit Eagle3DraftModel: missing {missing}, unexpected {unexpected}",
              file=sys.stderr)
        return 1
    model.load_state_dict(state, strict=False)
    print(f"  Eagle3DraftModel loaded {len(state)} tensors: "
          + json.dumps({k: list(v.shape) for k, v in sorted(state.items())}))
    if not args.inputs:
        return 0

    inputs = load_file(str(args.inputs))
    with torch.no_grad():
        model.embed_tokens.weight.copy_(inputs["embed"].float())
        seen = []
        hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(out.detach().clone()))
        s = inputs["tokens"].shape[0]
        model(hidden_states=inputs["features"].float()[None], input_ids=inputs["tokens"][None].long(),
              document_ids=torch.zeros(1, s, dtype=torch.long), ttt_steps=1)
        hook.remove()
    save_file({"logits": seen[0][0].contiguous(), "d2t": model.d2t.clone()}, str(args.out))
    print(f"  logits {list(seen[0][0].shape)} written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
