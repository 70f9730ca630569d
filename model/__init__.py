"""The llama2-style model: config, modules, kernel dispatch, HF interop.

Reading order:
    configuration_z2all.py  every shape and knob (HF Llama names), presets tiny..1.7B
    modeling_z2all.py       the model: blocks, loss, log-probs, FLOPs, save/load
    attention.py            GQA attention, padding -> positions and masks
    rope.py, rms_norm.py, mlp.py, kv_cache.py   one small concept each
    kernels.py              which implementation runs each hot op (flash-attn/apex/torch)
    chunked_lm_head.py      output projection + loss without materialising all logits
    generation.py           KV-cache decoding, greedy/top-k/top-p sampling, streaming
    hf_llama_mapping.py, convert_to_hf.py   to and from transformers' LlamaForCausalLM
    lora.py, lora_checkpoint.py   LoRA adapters (checked against peft) and what a LoRA run saves
    loading.py              `load_model(path)`: every kind of --ckpt, LoRA runs merged
    reference_ops.py        plain-math versions of the kernels, for the tests
"""
