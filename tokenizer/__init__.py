"""Our tokenizers: byte-level BPE (HF tokenizers) and sentencepiece BPE, AutoTokenizer-loadable."""
