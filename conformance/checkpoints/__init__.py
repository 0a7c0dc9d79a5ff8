"""Checkpoints the suite generates: tiny and crafted gpt-oss, quantized writers, the tokenizer,
and the validation of a user's checkpoint."""
