"""Training methods: what is learned from what. Today supervised fine-tuning and causal-LM training on text:
chat records into tokens with the loss on the answers (`sft`), the loss (`loss`), the held-out evaluation
and early stop (`evaluate`). Preference tuning (DPO) lands here beside them, with its pairs, loss and
evaluation.

May import `common`, `chat`, `model`, `sizing` and `data`.
"""
