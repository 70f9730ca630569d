"""The label convention every loss in the project shares.

`labels[b, t]` is the token position t must predict (datasets shift; the model does not), and
IGNORE_INDEX marks a position that is not trained on: a prompt token in SFT, padding, the last
position of a sample. -100 is also `torch.nn.functional.cross_entropy`'s default
`ignore_index` and what Hugging Face models use, so batches and losses interoperate."""

IGNORE_INDEX = -100
