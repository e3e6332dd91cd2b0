"""Loading models by name, folder or ``.gguf`` file, and the GGUF conversion cache."""
