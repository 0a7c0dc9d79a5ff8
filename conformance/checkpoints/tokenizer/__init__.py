"""The o200k_harmony tokenizer, offline: the vocabulary rebuilt from a registry package, an HF
tokenizer generated from it for the tiny gpt-oss, the harmony reference rendering, and the
fidelity and rendering verdicts the tokenizer and server checks use."""
