"""Direct preference optimization on Intel Orca DPO pairs with a LoRA-adapted LLM (paper §4, App. B, Table 11).

Each training sample is a preference pair (prompt x, chosen y+, rejected y-); its loss is DPO's sigmoid loss
against the frozen reference, which is the same network with the LoRA adapter disabled:

    g_i = -log sigmoid(beta * [log pi(y+|x)/ref(y+|x) - log pi(y-|x)/ref(y-|x)])

ERM, CSERM, FL and RFL act on g_i through the same method classes as every other task, with one multiplier per
pair. The model below outputs the policy margin beta*(log pi(y+|x) - log pi(y-|x)); the targets y are the
reference's margins, computed once with the adapter off (``prepare``), so the loss is -log sigmoid(out - y).
At initialization the LoRA update is exactly zero, hence every g_i = log 2.

Data: ``argilla/distilabel-intel-orca-dpo-pairs`` through HF ``datasets``, or ``--data FILE`` (JSONL or
Parquet with the dataset's columns). The dataset card's filtering, as in the paper: drop ties
(``status == "tie"``), keep ``chosen_score >= 8``, drop ``in_gsm8k_train``. The kept pairs are split 80/20 with
a seeded permutation (``data_seed``): n_train = floor(0.8 n), n_test = n - n_train; each split keeps source row
order, so sample id i of a split is the i-th kept pair of that split, and its *pair id* (the row number in the
source file/dataset, stable across models and runs) is saved in ``extras.npz`` (``train_pair_id``,
``test_pair_id``). Prompts are the system message (if any) and the user turn in the model's chat template;
completions are tokenized as trl's DPOTrainer does (the tokens after the common prefix of the templated prompt
and prompt+answer). Prompts keep their last ``max_prompt_length`` tokens, completions are cut at ``max_length``
in total; no pair is dropped, so every model sees the same pairs.

Models: ``model=tiny`` is a two-layer Llama built from a config with a byte-level tokenizer (no download; for
tests and CPU trials; its random "pretrained" weights are fixed, only the adapter depends on --seed), or any
Hugging Face causal LM name or local path with a chat template. On CUDA the base is loaded in 4-bit NF4
(bitsandbytes) unless ``quantize=false``. LoRA r 8, alpha 16, dropout 0.05 on peft's default modules. The
paper's hyperparameter table lists "LoRA alpha 1"; we follow the setting flctl was asked for (16); pass
``-o lora_alpha=1`` for the other reading.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flctl.errors import ConfigError
from flctl.tasks import Task

if TYPE_CHECKING:
    import torch

    from flctl.data import Dataset

DATASET = "argilla/distilabel-intel-orca-dpo-pairs"
HOME = f"https://huggingface.co/datasets/{DATASET}"    # where a copy for --data comes from (its Parquet files)
COLUMNS = ("system", "input", "chosen", "rejected", "status", "chosen_score", "in_gsm8k_train")
MIN_CHOSEN_SCORE = 8.0
TRAIN_SHARE = 0.8
TINY = "tiny"
TINY_BASE_SEED = 0    # the tiny model's "pretrained" weights: the same for every run seed
# A Zephyr-style template for the tiny model's byte-level tokenizer ("</s>" is its end-of-sequence token).
TINY_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
PROMPT, COMPLETION = 1, 2   # token roles in the packed inputs; 0 is padding


# ---------------------------------------------------------------------------------------------- data

def _require_llm() -> None:
    # Quiet two messages that say nothing about the run: bitsandbytes' CPU backend asking for the optional
    # `kernels` package at import (peft imports it), and a transformers deprecation peft triggers.
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    # Looked up, not imported: importing peft (and transformers under it) takes ~5 s, which a refusal or a plan
    # should not wait for; each is imported where it is used.
    for name in ("peft", "transformers", "trl"):
        if importlib.util.find_spec(name) is None:
            raise ConfigError(f"orca-dpo needs the llm extra ({name} is missing): pip install -e '.[llm]'")


def _read_rows(data: str | None) -> dict[str, list]:
    """The dataset's needed columns as lists, from a local JSONL/Parquet file or the Hugging Face Hub."""
    if data is None:
        import datasets.config
        from datasets import load_dataset

        if not _hub_reachable():   # the cache only: offline, each request would be retried for half a minute
            datasets.config.HF_HUB_OFFLINE = True
        try:
            hub = load_dataset(DATASET, split="train")
        except Exception as exc:  # offline, proxy, no cache: one message naming the way out
            raise ConfigError(f"could not load {DATASET} from the Hugging Face Hub ({type(exc).__name__}); pass "
                              f"--data FILE with a JSONL or Parquet copy of {HOME} (its columns)") from None
        table = hub.data.table     # the Arrow table behind the HF dataset
    else:
        path = Path(data)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".json", ".parquet"))
            if len(files) != 1:
                raise ConfigError(f"--data {path}: expected one .jsonl or .parquet file in the folder, "
                                  f"found {len(files)}")
            path = files[0]
        if not path.is_file():
            raise ConfigError(f"--data {path}: no such file (a JSONL or Parquet copy of {HOME})")
        import pyarrow as pa

        try:
            if path.suffix == ".parquet":
                import pyarrow.parquet as pq

                table = pq.read_table(path)
            else:
                import pyarrow.json as pj

                table = pj.read_json(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ConfigError(f"--data {path}: not readable as {'Parquet' if path.suffix == '.parquet' else 'JSONL'}"
                              f" ({str(exc).splitlines()[0][:120]})") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ConfigError(f"orca-dpo data lacks column(s) {', '.join(missing)}; expected the columns of {DATASET}")
    return table.select(list(COLUMNS)).to_pydict()


def select_pairs(rows: dict[str, list]) -> tuple[np.ndarray, dict[str, int]]:
    """Source row numbers of the pairs the paper keeps, and how many each filter dropped."""
    n = len(rows["status"])
    if n == 0:
        raise ConfigError("orca-dpo data has no pairs")
    tie = np.array([s == "tie" for s in rows["status"]])
    low = np.array([s is None or s < MIN_CHOSEN_SCORE for s in rows["chosen_score"]])
    gsm8k = np.array([bool(g) for g in rows["in_gsm8k_train"]])
    keep = np.flatnonzero(~tie & ~low & ~gsm8k)
    counts = {"rows": n, "ties": int(tie.sum()), "low_score": int((low & ~tie).sum()),
              "gsm8k": int((gsm8k & ~tie & ~low).sum()), "kept": len(keep)}
    if len(keep) < 2:
        raise ConfigError(f"orca-dpo data keeps {len(keep)} of {n} pairs after filtering (ties, chosen_score < 8, "
                          f"in_gsm8k_train); need at least 2 for a train/test split")
    for i in keep:
        for col in ("input", "chosen", "rejected"):
            if not isinstance(rows[col][i], str) or not rows[col][i].strip():
                raise ConfigError(f"orca-dpo data row {i} has an empty {col!r}: every kept pair needs a prompt "
                                  f"and two answers")
    return keep, counts


def split_pairs(keep: np.ndarray, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded 80/20 split of the kept source rows; each part in source order."""
    perm = np.random.default_rng(data_seed).permutation(len(keep))
    n_train = int(np.floor(TRAIN_SHARE * len(keep)))
    return np.sort(keep[perm[:n_train]]), np.sort(keep[perm[n_train:]])


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face Hub answers at all: offline, huggingface_hub retries each request for about a minute
    (printing every retry) before it looks in its cache, so a model name that is not cached would take that long
    to refuse."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    endpoint = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def load_tokenizer(options: dict):
    if options["model"] == TINY:
        from transformers import ByT5Tokenizer

        tokenizer = ByT5Tokenizer()   # byte-level: built in code, nothing to download
        tokenizer.chat_template = TINY_TEMPLATE
        return tokenizer
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(options["model"], local_files_only=not _hub_reachable())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load model {options['model']!r}: not a local path nor in the Hugging Face cache, "
                          f"and the Hub is unreachable ({type(exc).__name__}); download it first "
                          f"(`hf download {options['model']}`) or pass a local path") from None
    if not tokenizer.chat_template:
        raise ConfigError(f"model {options['model']!r} has no chat template; use a chat/instruct model")
    return tokenizer


def _messages(system: str | None, prompt: str) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system and system.strip() else []) + \
        [{"role": "user", "content": prompt}]


def tokenize_pairs(tokenizer, rows: dict[str, list], idx: np.ndarray, options: dict) -> torch.Tensor:
    """Pack pairs as int32 [N, 2 (chosen, rejected), 2 (token, role), L]; role 1 = prompt, 2 = completion."""
    import torch
    from trl.data_utils import common_prefix_length

    def ids(conversations, **kw) -> list[list[int]]:
        return tokenizer.apply_chat_template(conversations, tokenize=True, return_dict=True, **kw)["input_ids"]

    prompts = [_messages(rows["system"][i], rows["input"][i]) for i in idx]
    prompt_ids = ids(prompts, add_generation_prompt=True)
    full = {side: ids([p + [{"role": "assistant", "content": rows[side][i]}] for p, i in zip(prompts, idx)])
            for side in ("chosen", "rejected")}
    max_prompt, max_len = options["max_prompt_length"], options["max_length"]
    sequences = []   # per pair: [(tokens, roles) chosen, (tokens, roles) rejected]
    for k in range(len(idx)):
        # As trl's DPOTrainer: the completion starts where templated prompt and prompt+answer diverge.
        cut = min(common_prefix_length(prompt_ids[k], full[side][k]) for side in full)
        prompt = prompt_ids[k][:cut][-max_prompt:]
        pair = []
        for side in ("chosen", "rejected"):
            completion = full[side][k][cut:][:max_len - len(prompt)]
            pair.append((prompt + completion, [PROMPT] * len(prompt) + [COMPLETION] * len(completion)))
        sequences.append(pair)
    length = max(len(tokens) for pair in sequences for tokens, _ in pair)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    x = torch.zeros(len(idx), 2, 2, length, dtype=torch.int32)
    x[:, :, 0] = pad
    for k, pair in enumerate(sequences):
        for side, (tokens, roles) in enumerate(pair):
            x[k, side, 0, :len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
            x[k, side, 1, :len(roles)] = torch.tensor(roles, dtype=torch.int32)
    return x


def check(options: dict, data_dir: str | None) -> None:
    """Everything that can be wrong before a run starts: extra installed, options, model, data."""
    _require_llm()
    if not options["beta"] > 0:
        raise ConfigError(f"option beta must be > 0, got {options['beta']}")
    if options["lora_r"] < 1:
        raise ConfigError(f"option lora_r must be >= 1, got {options['lora_r']}")
    if not 0 < options["max_prompt_length"] < options["max_length"]:
        raise ConfigError("options need 0 < max_prompt_length < max_length, got "
                          f"{options['max_prompt_length']} and {options['max_length']}")
    load_tokenizer(options)
    select_pairs(_read_rows(data_dir))


def load(options: dict, data_dir: str | None) -> Dataset:
    import torch

    from flctl.data import Dataset, Split

    _require_llm()
    rows = _read_rows(data_dir)
    keep, counts = select_pairs(rows)
    train_idx, test_idx = split_pairs(keep, options["data_seed"])
    tokenizer = load_tokenizer(options)

    def split(idx: np.ndarray) -> Split:
        # y: the reference margins, filled by prepare() once the model exists.
        return Split(tokenize_pairs(tokenizer, rows, idx, options), torch.zeros(len(idx)))

    return Dataset(split(train_idx), split(test_idx),
                   meta={"train_pair_id": train_idx, "test_pair_id": test_idx, "filtered": counts})


# ---------------------------------------------------------------------------------------------- model

@functools.cache
def _policy_class() -> type:
    """The policy module's class, made at first use: planning a sweep of this task imports no torch."""
    import torch

    class DPOPolicy(torch.nn.Module):
        """Wraps a (LoRA-adapted) causal LM: packed pairs [B, 2, 2, L] -> policy margins [B]."""

        def __init__(self, lm: torch.nn.Module, beta: float) -> None:
            super().__init__()
            self.lm = lm
            self.beta = beta

        def sequence_logps(self, x: torch.Tensor) -> torch.Tensor:
            """Sum of log-probabilities of each answer's completion tokens given what precedes them: [B, 2]."""
            from trl.trainer.utils import selective_log_softmax

            tokens, roles = x[:, :, 0].flatten(0, 1).long(), x[:, :, 1].flatten(0, 1)       # [2B, L]: y+, y-, ...
            length = int((roles > 0).sum(-1).max())        # trim the split-wide padding to this batch's longest
            tokens, roles = tokens[:, :length], roles[:, :length]
            logits = self.lm(input_ids=tokens, attention_mask=(roles > 0).long(), use_cache=False).logits
            token_logps = selective_log_softmax(logits[:, :-1], tokens[:, 1:])             # [2B, L-1]
            completion = roles[:, 1:] == COMPLETION                                        # predicted token's role
            return torch.where(completion, token_logps, 0.0).sum(-1).view(-1, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            logps = self.sequence_logps(x)
            return self.beta * (logps[:, 0] - logps[:, 1])

    return DPOPolicy


def _base_model(options: dict, device: torch.device):
    import torch

    if options["model"] == TINY:
        from transformers import LlamaConfig, LlamaForCausalLM

        tokenizer = load_tokenizer(options)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                             bos_token_id=None, tie_word_embeddings=False)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TINY_BASE_SEED)
            return LlamaForCausalLM(config)
    from transformers import AutoModelForCausalLM

    # float32 off CUDA: a checkpoint saved in bf16 would otherwise load as bf16 (transformers' dtype "auto") and
    # meet the float32 LoRA adapters and reference log-probabilities in mixed-dtype products
    kwargs: dict = {"dtype": torch.float32}
    if device.type == "cuda":
        kwargs.update(dtype=torch.bfloat16, device_map={"": device.index or 0})
        if options["quantize"]:
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.bfloat16)
    try:
        model = AutoModelForCausalLM.from_pretrained(options["model"], **kwargs)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load model {options['model']!r} ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:160]})") from None
    if "quantization_config" in kwargs:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model)   # fp32 norms, input grads, gradient checkpointing
    return model


def build_model(options: dict, data: Dataset) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    device = data.train.x.device
    lm = _base_model(options, device)
    lora = LoraConfig(r=options["lora_r"], lora_alpha=options["lora_alpha"], lora_dropout=options["lora_dropout"],
                      task_type="CAUSAL_LM")
    return _policy_class()(get_peft_model(lm, lora), options["beta"])   # adapter init draws from the run's seed


def prepare(model: torch.nn.Module, data: Dataset, options: dict, precision: str = "auto") -> None:
    """Reference margins of every pair: the same forward with the adapter disabled, in eval mode."""
    import torch

    from flctl.losses import model_output

    was_training = model.training
    model.eval()
    with torch.no_grad(), model.lm.disable_adapter():
        for split in (data.train, data.test):
            chunk = TASK.eval_chunk
            split.y = torch.cat([model_output(model, split.x[i:i + chunk], precision)
                                 for i in range(0, len(split), chunk)])
    model.train(was_training)


def extras(model: torch.nn.Module, data: Dataset, options: dict) -> dict[str, np.ndarray]:
    """Each sample's pair id (its row in the source data), so records join back to prompts and answers."""
    return {"train_pair_id": np.asarray(data.meta["train_pair_id"]),
            "test_pair_id": np.asarray(data.meta["test_pair_id"])}


TASK = Task(
    name="orca-dpo",
    kind="preference",
    description="DPO on Intel Orca pairs (filtered, 80/20), LoRA LLM vs its frozen base; model=tiny for CPU",
    defaults=dict(epochs=20, batch_size=16, micro_batch=4, optimizer="adamw", lr=5e-6, weight_decay=0.0,
                  scheduler="cosine", warmup_steps=200, eval_every=5, eps=0.3, alpha=1.0, dual_lr=0.1),
    options=dict(model="meta-llama/Llama-3.1-8B-Instruct", beta=0.1, lora_r=8, lora_alpha=16, lora_dropout=0.05,
                 max_length=1024, max_prompt_length=512, quantize=True, data_seed=0),
    load=load,
    build_model=build_model,
    prepare=prepare,
    extras=extras,
    check=check,
    eval_chunk=8,
    smoke={"options": {"model": "tiny"}},
)
