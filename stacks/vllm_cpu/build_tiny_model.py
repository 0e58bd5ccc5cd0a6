"""Build the tiny model: run by the P/D node env's python (torch, transformers, tokenizers), never
by the harness's. ``python build_tiny_model.py PARAMS_JSON OUT_DIR``.

Everything is made here, nothing is downloaded (the caller sets HF_HUB_OFFLINE=1 and
TRANSFORMERS_OFFLINE=1): a corpus generated from a fixed word list and a seeded RNG, a byte-level
BPE tokenizer trained on it with ``tokenizers``, and a Llama whose weights are drawn from a seeded
torch RNG. The same parameters give the same files on every machine. Prints one JSON line (file
hashes, versions) on success.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

WORDS = (
    "the a an and or but if then when while of to in on at by for with from into over under after "
    "before between through during without about against among around near far up down out off "
    "prefill decode cache block token tokens request reply server client node worker scheduler "
    "engine transfer connector peer socket deadline timeout retry error fault chaos latency "
    "bandwidth memory layer head model prompt output input batch queue stream pull push send "
    "receive open close start stop kill restart heal probe check pass fail stall recover leak "
    "one two three four five six seven eight nine ten hundred thousand first last next every "
    "quick slow small large tiny long short new old good bad fast late early cold warm busy idle "
    "is are was were be been has have had do does did can will would should must may might "
    "cat dog bird fish tree river mountain city road house door window light water fire stone "
    "red green blue black white yellow north south east west morning evening night day week year"
).split()
PUNCT = (".", ".", ".", "?", "!", ",")


def corpus(seed: int, lines: int) -> list[str]:
    """Deterministic text: sentences of words from WORDS, some numbers and punctuation."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(4, 18)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        text = " ".join(words)
        out.append(text[0].upper() + text[1:] + rng.choice(PUNCT))
    return out


def build_tokenizer(params: dict, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [params["bos_token"], params["eos_token"], params["pad_token"]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=params["vocab_size"], special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(corpus(params["seed"], params["corpus_lines"]), trainer)
    if tok.get_vocab_size() > params["vocab_size"]:
        raise SystemExit(f"tokenizer vocab {tok.get_vocab_size()} > model vocab {params['vocab_size']}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0], eos_token=specials[1],
                                   pad_token=specials[2], model_max_length=params["max_position_embeddings"])
    fast.save_pretrained(out_dir)
    return fast


def build_model(params: dict, tokenizer, out_dir: Path):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = {k: tokenizer.convert_tokens_to_ids(params[f"{k}_token"]) for k in ("bos", "eos", "pad")}
    config = LlamaConfig(
        vocab_size=params["vocab_size"], hidden_size=params["hidden_size"],
        intermediate_size=params["intermediate_size"], num_hidden_layers=params["num_hidden_layers"],
        num_attention_heads=params["num_attention_heads"], num_key_value_heads=params["num_key_value_heads"],
        head_dim=params["head_dim"], max_position_embeddings=params["max_position_embeddings"],
        rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=params["initializer_range"],
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"],
    )
    torch.manual_seed(params["seed"])
    model = LlamaForCausalLM(config).to(getattr(torch, params["dtype"]))
    model.generation_config = GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                                               pad_token_id=ids["pad"])
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def main(argv: list[str]) -> int:
    params, out_dir = json.loads(argv[1]), Path(argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    import tokenizers
    import torch
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    torch.use_deterministic_algorithms(True)
    tokenizer = build_tokenizer(params, out_dir)
    build_model(params, tokenizer, out_dir)
    # read back what was written, the way a server will
    tok = AutoTokenizer.from_pretrained(out_dir)
    cfg = AutoConfig.from_pretrained(out_dir)
    sample = "The prefill node sends 42 blocks to the decode node."
    if tok.decode(tok(sample)["input_ids"]) != sample:
        raise SystemExit("tokenizer round trip failed")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, cfg.vocab_size) != (
            params["hidden_size"], params["num_attention_heads"], params["num_key_value_heads"],
            params["head_dim"], params["vocab_size"]):
        raise SystemExit(f"config read back differs: {cfg}")
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(out_dir.iterdir()) if p.is_file() and p.suffix in (".safetensors", ".json")}
    print(json.dumps({"files": files, "tokenizer_vocab": len(tok),
                      "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                   "tokenizers": tokenizers.__version__}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
