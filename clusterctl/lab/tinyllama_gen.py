"""Write the tiny real model: run by the real engine's venv python (torch, transformers, tokenizers).

``python tinyllama_gen.py OUT_DIR SPEC_JSON TEXT_FILE...`` -- not imported by clusterctl
(it needs torch); :mod:`clusterctl.lab.realmodel` runs it and owns the cache.  Everything
is seeded and single-threaded so two runs write byte-identical files.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' trainer: one thread, one order
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def main(argv: list[str]) -> int:
    out, spec_json, texts = argv[0], argv[1], argv[2:]
    spec = json.loads(spec_json)
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.set_num_threads(1)
    specials = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab"],
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=spec["max_position"],
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)

    cfg = LlamaConfig(
        vocab_size=spec["vocab"],
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        head_dim=spec["hidden"] // spec["heads"],
        max_position_embeddings=spec["max_position"],
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(spec["seed"])
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
