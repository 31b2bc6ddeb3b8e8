"""Builds bert_mb.mar: a BERT sequence classifier and its WordPiece tokenizer, made here.

    python examples/bert_classifier/build_mar.py --export-path model_store [--weights DIR]

Nothing is downloaded. The tokenizer is a WordPiece trained at build time on text from
texts.py; the model is a 4-layer BERT (hidden 256, 3 labels) with random weights from a
fixed seed, so its answers mean nothing but the serving path is the real one. With
``--weights DIR`` (or ``WEIGHTS=DIR``), a directory ``save_pretrained`` wrote (config.json
and the weights, with its tokenizer files; without them the tokenizer made here is used,
which fits only a model trained with it), that model is packed instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ts_microbatch.tools.bundle import run_archiver

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import texts  # noqa: E402

MODEL_NAME = "bert_mb"
LABELS = ("negative", "neutral", "positive")
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The example's model; tests pass a smaller one.
BERT = {
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "intermediate_size": 1024,
    "max_position_embeddings": 512,
}
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


def make_tokenizer(out: Path, vocab_size: int = 8000, max_length: int = 512) -> Any:
    """Trains a BERT WordPiece tokenizer on texts.corpus() and saves it to ``out`` as a
    transformers tokenizer (``AutoTokenizer.from_pretrained(out)`` loads it offline)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer
    from transformers import BertTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    trainer = WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS)
    tokenizer.train_from_iterator(texts.corpus(), trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = BertTokenizerFast(
        tokenizer_object=tokenizer,
        model_max_length=max_length,
        **{f"{name}_token": f"[{name.upper()}]" for name in ("pad", "unk", "cls", "sep", "mask")},
    )
    fast.save_pretrained(out)
    return fast


def make_model(out: Path, vocab_size: int, bert: Mapping[str, int] = BERT, seed: int = 0) -> None:
    """A BertForSequenceClassification with random weights from ``seed``, saved to ``out``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=vocab_size,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
        **bert,
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).eval().save_pretrained(out)


def make_model_dir(
    out: Path, weights: str | os.PathLike[str] | None = None, bert: Mapping[str, int] = BERT
) -> Path:
    """``out`` holding config.json, the weights and the tokenizer files: from ``weights``
    (a save_pretrained directory), else made here with untrained weights."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched, even by mistake
    shutil.rmtree(out, ignore_errors=True)
    if weights is not None:
        source = Path(weights)
        if not (source / "config.json").is_file():
            raise SystemExit(f"--weights {source}: expected a directory with config.json")
        shutil.copytree(source, out)
        if not any((out / name).exists() for name in TOKENIZER_FILES):
            print(f"{source} has no tokenizer: using the one trained here", file=sys.stderr)
            make_tokenizer(out)
        return out
    out.mkdir(parents=True)
    tokenizer = make_tokenizer(out, max_length=bert["max_position_embeddings"])
    make_model(out, len(tokenizer), bert)
    print("Created an UNTRAINED BERT classifier: predictions are meaningless.", file=sys.stderr)
    return out


def build_mar(
    export_path: str | os.PathLike[str],
    *,
    model_name: str = MODEL_NAME,
    weights: str | os.PathLike[str] | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    model_config: str | os.PathLike[str] = HERE / "model-config.yaml",
    self_contained: bool = False,
    archive_format: str = "default",
    bert: Mapping[str, int] = BERT,
) -> Path:
    """Writes ``<export_path>/<model_name>.mar`` and returns its path; the model directory's
    files land in the .mar's root, where ``from_pretrained(model_dir)`` finds them.
    ``bert``: the size of the untrained model (tests make a smaller one)."""
    work = Path(work_dir or ROOT / "build" / model_name)
    model_dir = make_model_dir(work / "model", weights, bert)
    extra = [str(model_dir), str(HERE / "texts.py")]
    if self_contained:
        from ts_microbatch.tools.bundle import vendor

        extra.append(str(vendor(work / "vendor")))
    Path(export_path).mkdir(parents=True, exist_ok=True)
    run_archiver(
        [
            "--force",
            "--model-name",
            model_name,
            "--version",
            "1.0",
            "--handler",
            str(HERE / "bert_handler.py"),
            "--config-file",
            str(model_config),
            "--extra-files",
            ",".join(extra),
            "--export-path",
            str(export_path),
            "--archive-format",
            archive_format,
        ]
    )
    (work / "sample.txt").write_text(texts.make_text(seed=0, n_words=24) + "\n", encoding="utf-8")
    mar = Path(export_path) / f"{model_name}.mar"
    print(f"Built {mar}")
    return mar


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export-path", default=str(ROOT / "model_store"))
    parser.add_argument("--model-name", default=MODEL_NAME)
    parser.add_argument(
        "--weights",
        default=os.environ.get("WEIGHTS") or None,
        help="a save_pretrained directory (config.json, weights, tokenizer); untrained if omitted",
    )
    parser.add_argument("--model-config", default=str(HERE / "model-config.yaml"))
    parser.add_argument(
        "--self-contained",
        action="store_true",
        help="carry ts_microbatch's worker modules (for a TorchServe without the package)",
    )
    args = parser.parse_args()
    build_mar(
        args.export_path,
        model_name=args.model_name,
        weights=args.weights,
        work_dir=ROOT / "build" / args.model_name,
        model_config=args.model_config,
        self_contained=args.self_contained,
    )


if __name__ == "__main__":
    main()
