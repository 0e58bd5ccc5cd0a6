"""Make the tiny model this report uses: a random-weight Llama (hidden 128, 4 heads, 2 KV heads,
head size 32, 2 layers, vocab 512, bfloat16, 512 positions) and a byte-level BPE tokenizer trained
on generated text. Nothing is downloaded; the seeds make the same files on every machine.

    python make_model.py OUT_DIR      (run with the python of the venv that has vLLM: it needs
                                       torch, transformers and tokenizers, which vLLM installs)
"""

import random
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PARAMS = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 512,
          "dtype": "bfloat16", "initializer_range": 0.02, "seed": 20240601, "corpus_lines": 4000,
          "bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}

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


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python make_model.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        print(f"model already made in {out}")
        return 0
    import torch

    torch.use_deterministic_algorithms(True)
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(PARAMS, tmp)
    build_model(PARAMS, tokenizer, tmp)
    tmp.rename(out)
    print(f"model made in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
