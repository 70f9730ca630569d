"""Is the standalone evaluator as fast as the trainer's eval? Tokens/s of both, same data.

    python -m bench.bench_evaluate [--smoke] [--preset tiny] [--seq_len 256] [--batch_size 8]

Measured on this machine, one after the other, on one corpus written as .jsonl:
1. evaluator: `tools.evaluate.language_model_metrics`, which reads the raw file, tokenizes and
   packs it on the fly, then runs the trainer's `evaluate_language_model`;
2. trainer:   the trainer's eval path on the same corpus pretokenized beforehand
   (`PretokDatasetWithIndex` -> `eval_loader` -> `evaluate_language_model`), the
   pretokenization not counted.
Printed: target tokens/s of each (the model's forward plus the bytes count of bits per byte),
their ratio evaluator / trainer (< 1: the on-the-fly tokenization costs that much), and both
losses, which must agree.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import default_collate

from bench import figures
from bench.bench_preprocess import corpus_texts, tokenizer_dir
from bench.size_flags import bench_parser
from data_preprocess.build_pretrain_sample_index_map import build_sample_index
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from dataset.dataset_pretrain import PretokDatasetWithIndex
from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM
from tokenizer import load_tokenizer
from tools.evaluate import language_model_metrics
from trainer.distributed_env import DistributedEnv
from trainer.evaluation import eval_loader, evaluate_language_model


def timed(run) -> tuple[dict, float]:
    start = time.perf_counter()
    result = run()
    return result, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__.split("\n\n")[0], quick="1000 documents instead of 3000",
                          smoke="a small corpus and model: only checks that it runs")
    parser.add_argument("--preset", default="tiny", help="model preset (Z2allConfig.from_preset)")
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=8)
    args = parser.parse_args(argv)
    figures.start(args, "bench_evaluate")
    if args.smoke:
        args.seq_len = min(args.seq_len, 64)
    torch.set_num_threads(1)
    use_demo = not args.smoke  # the demo's corpus and tokenizer where built; --smoke never
    texts = corpus_texts(use_demo, 100 if args.smoke else 1000 if args.quick else 3000)
    device = torch.device("cpu")
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        tokenizer_path = tokenizer_dir(texts, scratch, use_demo)
        tokenizer = load_tokenizer(tokenizer_path)
        raw = scratch / "raw"
        raw.mkdir()
        with open(raw / "corpus.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps({"text": text}, ensure_ascii=False) + "\n"
                              for text in texts)
        pretokenize_pretrain_data(raw, tokenizer_path, scratch / "pretok", num_workers=1)
        build_sample_index(scratch / "pretok", args.seq_len, valid_samples=0)
        dataset = PretokDatasetWithIndex(scratch / "pretok", args.seq_len, "train")

        torch.manual_seed(0)
        model = Z2allForCausalLM(Z2allConfig.from_preset(
            args.preset, vocab_size=len(tokenizer),
            max_position_embeddings=args.seq_len)).eval()
        env = DistributedEnv(0, 1, 0, 1, device)
        loader = eval_loader(dataset, default_collate, args.batch_size, len(dataset), env)
        trainer, trainer_s = timed(lambda: evaluate_language_model(model, loader, tokenizer,
                                                                   env))
        evaluator, evaluator_s = timed(lambda: language_model_metrics(
            model, tokenizer, [str(raw)], args.seq_len, args.batch_size, ["text"], device))

    trainer_rate = trainer["val_tokens"] / trainer_s
    evaluator_rate = evaluator["tokens"] / evaluator_s
    print(f"preset {args.preset}, L={args.seq_len}, batch {args.batch_size}, "
          f"{evaluator['tokens']:,} target tokens, {torch.get_num_threads()} torch thread")
    print(f"trainer eval  {trainer_rate:10.0f} tokens/s   loss {trainer['val_loss']:.6f}")
    print(f"evaluator     {evaluator_rate:10.0f} tokens/s   loss {evaluator['loss']:.6f}")
    print(f"evaluator / trainer = {evaluator_rate / trainer_rate:.2f}")
    figures.record("evaluator (tokenizes on the fly)", evaluator_rate, trainer_rate, "tokens/s",
                   "the trainer's eval on pretokenized data")
    figures.finish()


if __name__ == "__main__":
    main()
