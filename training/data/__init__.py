"""Data: corpus files and their records (`corpus`: file formats and record layouts, every record used or
counted as skipped), prepared token shards and their manifest (`shards`, `shard_check`), the tokenizer and
the packed blocks the loop reads (`batches`), and the bundled sample text (`sample/`).

A new file format or record layout (ShareGPT's conversations, content-part lists) is read here; what is
trained in a record is decided in `methods`. May import `common`, `chat` and `model`.
"""
