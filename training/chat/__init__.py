"""Chat templates as a model release ships them: turns rendered with the tokenizer's own template and the
spans each turn covers (`template`), and the tokens that end a turn or a generation (`stop_tokens`).

What a family's template does with a kind of turn (system, reasoning, tool calls, history) belongs here.
Reading a file's record layout (ShareGPT, content-part lists) into role/content turns belongs to `data`;
which turns of a conversation are trained, and how, to `methods`. Imports `common` only. Torch-free.
"""
