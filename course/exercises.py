"""The exercises: each is one real function of z2all, checked by the project's own tests.

An exercise names its target (`pkg.module:Qual.name`), the existing test node ids that check
it (chosen because they fail when the function is wrong: `tests/course/` proves it for every
common mistake listed here), and its common mistakes, one file each under
`course/mistakes/<exercise>/<mistake>.py`: a complete wrong answer whose docstring's first line
names the mistake and whose rest says how to see it. `check` prints those names on a failure.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

from course.swap import REPO

MISTAKES_DIR = REPO / "course" / "mistakes"
WORK_ENV = "Z2ALL_COURSE_WORK"  # another folder for the workspaces (the course's own tests)


def work_dir() -> Path:
    """Where workspaces live: course/work/ (git-ignored), or $Z2ALL_COURSE_WORK."""
    return Path(os.environ.get(WORK_ENV) or REPO / "course" / "work")


@dataclass(frozen=True)
class Mistake:
    path: Path
    title: str   # the mistake, named: "not dividing by the world size"
    hint: str    # what it does and where to look


@dataclass(frozen=True)
class Exercise:
    name: str
    chapter: int
    target: str
    tests: tuple[str, ...]
    mistakes: tuple[str, ...]

    @property
    def workspace(self) -> Path:
        return work_dir() / f"{self.name}.py"

    def mistake_files(self) -> list[Mistake]:
        found = []
        for slug in self.mistakes:
            path = MISTAKES_DIR / self.name / f"{slug}.py"
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or slug
            title, _, hint = doc.partition("\n")
            found.append(Mistake(path, title.strip().rstrip("."), " ".join(hint.split())))
        return found


KERNELS = "tests/model/test_kernels.py"
CONTEXT = "tests/parallel/test_context_parallel.py"
SENTENCEPIECE = "tests/tokenizer/test_native_sentencepiece.py"
GRPO_LOSS = "tests/trainer/test_grpo_loss.py"

EXERCISES = [
    Exercise("bpe_merges", 1, "tokenizer.sentencepiece_bpe:sentencepiece_to_tokenizers",
             (f"{SENTENCEPIECE}::test_both_paths_give_the_same_ids",
              f"{SENTENCEPIECE}::test_both_paths_give_the_same_ids_on_a_corpus"),
             ("merges_ranked_worst_first", "no_byte_fallback")),
    Exercise("sample_slots", 2,
             "data_preprocess.build_pretrain_sample_index_map:slot_pairs",
             ("tests/data_preprocess/test_build_pretrain_sample_index_map.py"
              "::test_tiling_split_and_items",),
             ("offset_in_slots", "searchsorted_left")),
    Exercise("rms_norm", 3, "model.kernels:rms_norm",
             (f"{KERNELS}::test_rms_norm_matches_reference",
              f"{KERNELS}::test_rms_norm_bf16_input_is_normalised_in_fp32"),
             ("subtracts_the_mean", "normalised_over_every_dimension")),
    Exercise("rotary", 3, "model.kernels:apply_rotary",
             (f"{KERNELS}::test_rotary_matches_complex_rotation",),
             ("interleaved_pairs", "rotated_the_wrong_way")),
    Exercise("lr_schedule", 4, "trainer.lr_schedule:LRSchedule.__call__",
             ("tests/trainer/test_lr_schedule.py",),
             ("warmup_starts_at_zero", "decays_to_zero")),
    Exercise("grad_clip", 4, "optimizer.clip_grads:clip_grads_",
             ("tests/optimizer/test_clip_grads.py::test_replicated_norm_and_clip_match_torch",),
             ("inverted_ratio",)),
    Exercise("global_batch", 4, "trainer.global_batch:attach_per_replica",
             ("tests/trainer/test_forward_steps.py",),
             ("not_divided_by_replicas", "per_micro_batch_mean")),
    Exercise("sft_labels", 5, "dataset.dataset_sft:shifted_labels",
             ("tests/data_preprocess/test_pretokenize_chat.py::test_sft_store_labels_and_truncation",
              "tests/tools/test_inspect_batch.py::test_sft_table_shows_shifted_labels_and_mask"),
             ("not_shifted", "mask_read_one_early")),
    Exercise("sft_packing", 5, "dataset.sft_packing:first_fit_decreasing",
             ("tests/dataset/test_sft_packing.py::test_first_fit_decreasing_follows_the_worked_example",
              "tests/dataset/test_sft_packing.py::test_packed_batch_layout"),
             ("not_sorted",)),
    Exercise("dpo_loss", 6, "trainer.dpo_loss:dpo_loss",
             ("tests/trainer/test_dpo_loss.py",),
             ("no_reference_model", "smoothing_swapped")),
    Exercise("checkpoint_sealed", 7, "utils.checkpoint:verify_checkpoint",
             ("tests/utils/test_checkpoint.py",),
             ("sizes_only", "required_not_checked")),
    Exercise("ddp_buckets", 8,
             "parallel.distributed_data_parallel.param_and_grad_buffer:plan_layout",
             ("tests/parallel/test_param_and_grad_buffer.py",
              "tests/parallel/test_ddp.py::test_overlap_launches_first_bucket_during_backward"),
             ("registration_order", "buckets_not_padded")),
    Exercise("allreduce_average", 8,
             "parallel.distributed_data_parallel.ddp_comm_hooks.default_hooks:"
             "allreduce_average_async",
             ("tests/parallel/test_comm_hooks.py::test_compression_and_reduce_scatter_against_exact",
              "tests/parallel/test_ddp.py::test_gradients_match_torch_ddp"),
             ("not_divided_by_world_size",)),
    Exercise("zero1_shard_map", 9,
             "optimizer.distributed_optimizer.shard_map:overlaps_with_shard",
             ("tests/optimizer/test_distributed_optimizer_shard_map.py",),
             ("keeps_empty_pieces", "ignores_the_shard_end")),
    Exercise("tp_copy_backward", 10,
             "parallel.tensor_parallel.collectives:_CopyToRegion.backward",
             ("tests/parallel/test_tensor_parallel.py::test_tensor_parallel_pieces_match_references",),
             ("identity_backward",)),
    Exercise("pipeline_1f1b", 11,
             "parallel.pipeline_parallel.schedules:one_forward_one_backward_order",
             ("tests/parallel/test_schedule_orders.py",),
             ("warmup_of_p_minus_s", "same_warmup_on_every_stage")),
    Exercise("cp_held_positions", 12, "parallel.context_parallel.load_balance:held_positions",
             (f"{CONTEXT}::test_held_positions_worked_example_and_odd_length",
              f"{CONTEXT}::test_shard_and_unshard_round_trip"),
             ("contiguous_pieces", "tail_chunk_off_by_one")),
    Exercise("lse_merge", 12, "parallel.context_parallel.block_attention:merge_into",
             (f"{CONTEXT}::test_merged_blocks_and_block_grads_equal_full_attention",),
             ("averages_the_blocks", "lse_not_updated")),
    Exercise("minhash_signature", 13, "data_preprocess.cleaning.minhash:signature",
             ("tests/data_preprocess/cleaning/test_minhash.py"
              "::test_jaccard_estimate_within_expected_error_of_truth_and_datasketch",),
             ("one_hash_for_every_row",)),
    Exercise("lsh_bands", 13, "data_preprocess.cleaning.minhash:band_keys",
             ("tests/data_preprocess/cleaning/test_minhash.py"
              "::test_lsh_recall_at_least_datasketch_and_no_distinct_document_removed",),
             ("overlapping_bands",)),
    Exercise("kv_cache_append", 14, "model.kv_cache:KVCache.append",
             ("tests/model/test_generation.py"
              "::test_kv_cache_decoding_equals_full_recomputation_past_initial_capacity",
              "tests/model/test_generation.py::test_kv_cache_logits_equal_full_forward_token_by_token"),
             ("writes_from_slot_zero", "returns_only_this_step")),
    Exercise("decode_batch_keep", 14, "server.batch:DecodeBatch.keep",
             ("tests/server/test_batch.py::test_rows_joining_and_leaving_decode_like_solo_sequences",),
             ("padding_not_cut", "cache_length_not_reduced")),
    Exercise("grpo_advantages", 15, "trainer.grpo_loss:group_advantages",
             (f"{GRPO_LOSS}::test_the_advantages_equal_trls",
              "tests/trainer/test_train_grpo.py::test_a_reward_that_scores_nothing_teaches_nothing"),
             ("batch_std_for_groups", "population_std", "no_epsilon", "nan_not_zeroed")),
    Exercise("grpo_token_loss", 15, "trainer.grpo_loss:token_terms",
             (f"{GRPO_LOSS}::test_the_loss_and_its_gradient_equal_trls",
              f"{GRPO_LOSS}::test_the_first_iteration_is_on_policy"),
             ("clip_without_the_min", "min_of_the_ratios", "kl_ratio_inverted",
              "epsilons_swapped")),
]

BY_NAME = {exercise.name: exercise for exercise in EXERCISES}
