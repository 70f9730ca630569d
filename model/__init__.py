"""The llama2-style model: config, modules, kernel dispatch, HF interop."""
