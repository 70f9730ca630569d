"""KV-cache generation vs full recomputation, batching vs one prompt at a time, sampling."""

from __future__ import annotations

import torch

from model.generation import sample_next_token
from tests.model.model_helpers import VOCAB, left_padded, small_model


def _greedy_by_full_recomputation(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The definition of greedy decoding: rerun the whole sequence for every new token."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([tokens])).logits[0, -1]
            tokens.append(int(logits.argmax()))
    return tokens


def test_kv_cache_decoding_equals_full_recomputation_past_initial_capacity():
    model = small_model("gqa").eval()
    prompt = torch.randint(0, VOCAB, (6,)).tolist()
    # The cache starts with room for 8 tokens and must grow (twice) to hold 6 + 20.
    cached = model.generate(torch.tensor([prompt]), max_new_tokens=20, cache_capacity=8)
    assert cached[0].tolist() == _greedy_by_full_recomputation(model, prompt, 20)


def test_kv_cache_logits_equal_full_forward_token_by_token():
    model = small_model("mqa").eval()
    sequence = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        full_logits = model(sequence).logits
        cache = model.new_kv_cache(batch_size=2, capacity=3)
        step_logits = [model.next_token_logits(sequence[:, :4], None, cache)]
        step_logits += [model.next_token_logits(sequence[:, t:t + 1], None, cache)
                        for t in range(4, 12)]
    assert torch.allclose(torch.stack(step_logits, dim=1), full_logits[:, 3:], atol=1e-5)


def test_batch_of_different_length_prompts_equals_each_alone():
    model = small_model("gqa").eval()
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in (3, 8, 5)]
    input_ids, attention_mask = left_padded(prompts, pad_id=0)
    batched = model.generate(input_ids, max_new_tokens=10, attention_mask=attention_mask)
    for row, prompt in enumerate(prompts):
        alone = model.generate(torch.tensor([prompt]), max_new_tokens=10)[0]
        assert batched[row, -10:].tolist() == alone[-10:].tolist()


def test_right_padded_prompts_are_realigned():
    model = small_model("gqa").eval()
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in (4, 7)]
    left_ids, left_mask = left_padded(prompts, pad_id=0)
    right_ids = torch.tensor([p + [0] * (7 - len(p)) for p in prompts])
    right_mask = torch.tensor([[1] * len(p) + [0] * (7 - len(p)) for p in prompts])
    from_left = model.generate(left_ids, max_new_tokens=6, attention_mask=left_mask)
    from_right = model.generate(right_ids, max_new_tokens=6, attention_mask=right_mask)
    assert torch.equal(from_left, from_right)


def test_rows_stop_at_eos_and_are_padded_afterwards():
    model = small_model("gqa").eval()
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in (4, 6)]
    input_ids, attention_mask = left_padded(prompts, pad_id=0)
    free_run = model.generate(input_ids, max_new_tokens=8, attention_mask=attention_mask)
    eos = int(free_run[0, -8 + 2])  # make row 0's third new token the EOS
    stopped = model.generate(input_ids, max_new_tokens=8, attention_mask=attention_mask,
                             eos_token_id=eos, pad_token_id=VOCAB - 1)
    new = stopped[:, input_ids.shape[1]:]
    first_eos = new[0].tolist().index(eos)
    assert first_eos <= 2
    assert (new[0, first_eos + 1:] == VOCAB - 1).all()
    if eos not in free_run[1, -8:].tolist():  # row 1 never stops: it is unaffected
        assert new[1].tolist() == free_run[1, -8:][:new.shape[1]].tolist()


def test_streaming_yields_the_same_tokens_as_generate():
    model = small_model("gqa").eval()
    prompt = torch.randint(0, VOCAB, (1, 5))
    streamed = [int(token) for token in model.stream_generate(prompt, max_new_tokens=7)]
    assert streamed == model.generate(prompt, max_new_tokens=7)[0, 5:].tolist()


def test_sampling_filters_and_seed():
    logits = torch.randn(4, VOCAB) * 3
    greedy = logits.argmax(dim=-1)
    assert torch.equal(sample_next_token(logits, 1.0, 1, None, None), greedy)  # top_k=1
    assert torch.equal(sample_next_token(logits, 1.0, None, 1e-6, None), greedy)  # tiny top_p

    def draws(seed):
        generator = torch.Generator().manual_seed(seed)
        return torch.stack([sample_next_token(logits, 0.8, 20, 0.9, generator)
                            for _ in range(50)])

    assert torch.equal(draws(7), draws(7))
    samples = draws(8)
    top20 = logits.topk(20, dim=-1).indices
    assert all(set(samples[:, row].tolist()) <= set(top20[row].tolist()) for row in range(4))


def test_top_p_keeps_exactly_the_nucleus():
    """Probabilities 0.5, 0.3, 0.15, 0.05: top_p=0.7 keeps the first two, never the rest."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    generator = torch.Generator().manual_seed(0)
    seen = {int(sample_next_token(logits, 1.0, None, 0.7, generator)) for _ in range(200)}
    assert seen == {0, 1}


def model_with_loud_padding_ids(real_vocab: int = 50):
    """Vocabulary 50 padded to 64, the 14 padding rows scaled up so that their logits win."""
    model = small_model("gqa", vocab_size=real_vocab).eval()
    assert model.config.vocab_size == 64
    with torch.no_grad():
        model.lm_head.weight[real_vocab:] *= 50
    return model


def test_padded_vocabulary_ids_are_never_generated():
    model, real_vocab = model_with_loud_padding_ids(), 50
    prompt = torch.randint(0, real_vocab, (1, 5))
    unmasked = model.generate(prompt, max_new_tokens=8)[0, 5:]
    assert (unmasked >= real_vocab).any()  # the padding ids would win without the mask
    greedy = model.generate(prompt, max_new_tokens=8, real_vocab_size=real_vocab)[0].tolist()
    tokens = prompt[0].tolist()
    with torch.no_grad():  # reference: greedy by full recomputation over the real ids only
        for _ in range(8):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1, :real_vocab].argmax()))
    assert greedy == tokens
    generator = torch.Generator().manual_seed(3)
    sampled = model.generate(prompt, max_new_tokens=30, temperature=1.5, top_p=0.99,
                             real_vocab_size=real_vocab, generator=generator)
    assert sampled.max() < real_vocab


def test_sampling_over_the_real_vocabulary_matches_torch_multinomial():
    logits = torch.randn(3, 64) * 2
    ours = sample_next_token(logits, 0.7, None, None, torch.Generator().manual_seed(5), 50)
    reference = torch.multinomial((logits[:, :50] / 0.7).softmax(-1), 1,
                                  generator=torch.Generator().manual_seed(5))[:, 0]
    assert torch.equal(ours, reference)


def test_a_tiny_temperature_samples_greedily_instead_of_failing():
    logits = torch.randn(4, VOCAB) * 3
    for temperature in (1e-40, 1e-45):
        sampled = sample_next_token(logits, temperature, None, 0.9, torch.Generator())
        assert torch.equal(sampled, logits.argmax(dim=-1))
