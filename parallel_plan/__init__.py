"""The plan: how *our llama* is spread over the device grid.

`parallel/` holds the mechanisms and knows no model (our DDP, ZeRO's units, the tensor-parallel
layers and the slicing of a weight, the pipeline schedule, ring attention), as torch's
`fully_shard` / pipelining and Megatron core's `tensor_parallel` know none. What is specific
to our llama lives here, above both `model/` and `parallel/`:

    llama_shapes.py           what the model's shapes allow (heads, vocabulary, layers by T, P)
    llama_tensor_parallel.py  which linears are column- or row-parallel (`layout_for`), and the
                              model turned tensor-parallel (`parallelize_model`)
    tensor_parallel_lora.py   LoRA adapters sliced like their base weight
    llama_pipeline.py         where the stages cut and how a stage runs the model's own parts
    llama_units.py            which submodules are ZeRO-2/3 units (the decoder blocks)
    memory_plan.py            the bytes each rank holds, laid out as the above lay them out

The trainer composes these with the mechanisms (trainer/parallelize.py,
trainer/model_parallel.py).
"""
