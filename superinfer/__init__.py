"""superinfer: an LLM serving engine that keeps latency promises."""

from superinfer.outputs import CompletionOutput, RequestOutput
from superinfer.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "LLM":  # imported lazily: it pulls in torch and transformers
        from superinfer.engine.llm import LLM

        return LLM
    raise AttributeError(name)
