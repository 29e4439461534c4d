"""Architecture families: importing this package registers every one of them."""

from superinfer.model.families import gemma, granite, llama, mixtral, phi3, qwen

__all__ = ["gemma", "granite", "llama", "mixtral", "phi3", "qwen"]
