"""Data: corpus files and their records (`corpus`), prepared token shards and their manifest (`shards`,
`shard_check`), the tokenizer and the packed blocks the loop reads (`batches`), and the bundled sample text
(`sample/`).

A new file format or record reader belongs here. May import `common`, `chat` and `model`.
"""
