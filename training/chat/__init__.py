"""Chat templates as a model release ships them: turns rendered with the tokenizer's own template and the
spans each turn covers (`template`), and the tokens that end a turn or a generation (`stop_tokens`).

What a family's template does with a kind of turn (system, reasoning, tool calls, history) belongs here; how
a data set's records become training examples belongs to `methods`. Imports `common` only. Torch-free.
"""
