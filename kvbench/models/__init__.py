"""Models from outside kvbench: transformers' (the oracle), GGUF files, the real-text corpus, compiled steps."""
