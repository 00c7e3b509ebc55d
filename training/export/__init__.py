"""The export: a checkpoint into a Hugging Face model folder (`command`, `python -m training.export`), what
every export writes (`files`: config, tokenizer, generation config, safetensors), a LoRA run's adapter in
peft's format and its merged folder (`lora`).

May import every room below it (through `checkpoint`); the run calls it at the end.
"""
