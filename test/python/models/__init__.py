"""Small GPT/LLaMA modules written from scratch for test_export_models.py,
each in the style of a different widely used public implementation (the
code is ours; the idioms are theirs).  Each is built as Class(config) and
called as forward(tokens, targets)."""
