"""Target-model wire formats: tokenizer loading, prompt rendering, completion assembly."""
