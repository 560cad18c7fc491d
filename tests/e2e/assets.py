"""The e2e run's inputs, built locally in ~5 s (run with the engine venv's Python):
a byte-level BPE tokenizer trained on synthetic "Tom has N apples" text, a 2.5 M-parameter
Qwen2 with random weights whose vocabulary equals the tokenizer's (else vLLM and the actor
score different supports), and gsm8k-shaped parquet files whose rows come from two data
sources (`SOURCES`): the second's questions have larger numbers, so its ground truths are
over 100 and a row's source can be read back from verl's rollout dump (`source_of`).

    python -m tests.e2e.assets DIR   →   DIR/model, DIR/train.parquet, DIR/test.parquet
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


SOURCES = ("openai/gsm8k", "rlotel/large-numbers")  # the dataset's data_source, by row parity
LARGE = 100  # the first source's answers are at most this, the second's above it


def question(rng: random.Random, low: int = 1, high: int = 50) -> tuple[str, int]:
    a, b = rng.randint(low, high), rng.randint(low, high)
    return f"Tom has {a} apples and buys {b} more. How many apples does Tom have?", a + b


def source_of(ground_truth: str) -> str:
    """The data source of a row, from its ground truth (as verl's rollout dump gives it)."""
    return SOURCES[int(ground_truth) > LARGE]


def build_tokenizer(rng: random.Random):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = []
    for _ in range(3000):
        text, answer = question(rng)
        corpus += [f"{text} {INSTRUCTION}", f"Tom has {answer} apples. #### {answer}"]
    corpus.append("system user assistant\n")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(out: Path) -> None:
    import pandas as pd
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    rng = random.Random(0)
    model_dir = out / "model"
    tokenizer = build_tokenizer(rng)
    tokenizer.save_pretrained(model_dir)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(model_dir)
    for split, rows in (("train", 64), ("test", 8)):
        records = []
        for index in range(rows):
            source = SOURCES[index % 2]
            text, answer = question(rng) if index % 2 == 0 else question(rng, 51, 99)
            records.append(
                {
                    "data_source": source,
                    "prompt": [{"role": "user", "content": f"{text} {INSTRUCTION}"}],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": str(answer)},
                    "extra_info": {"split": split, "index": index, "question": text},
                }
            )
        pd.DataFrame(records).to_parquet(out / f"{split}.parquet")


if __name__ == "__main__":
    build(Path(sys.argv[1]))
