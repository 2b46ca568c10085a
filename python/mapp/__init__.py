"""mapp Python front end: the reference GPT (the numerical oracle) and the
PyTorch -> mapp IR exporter."""
