"""Makes the tokenizer / harmony / server fixtures visible to the checks.

They live in conformance/serving_fixtures.py; importing them here registers them with pytest. (Once
the plugin registers that module as it registers conformance.fixtures, this file can go.)"""

from conformance.serving_fixtures import (  # noqa: F401
    harmony_encoding,
    hf_tokenizer,
    model_tokenizer_dir,
    o200k_harmony,
    o200k_vocab,
    served_model,
    server,
    server_call_timeout_s,
    tokenizer_facts,
)
