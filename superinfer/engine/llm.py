"""The offline API, shaped like vLLM's: `LLM(...).generate(prompts, params)`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from superinfer.config import EngineConfig
from superinfer.engine.llm_engine import LLMEngine, PromptType
from superinfer.outputs import RequestOutput
from superinfer.sampling_params import SamplingParams

Conversation = Sequence[Mapping[str, str]]


class LLM:
    """Generate for a batch of prompts at once (continuous batching inside).

    Engine options are flat keywords, as on the command line: `LLM(dtype="bfloat16",
    policy="fcfs-swap", num_device_blocks=64)`; see `superinfer.config` for all of them.
    """

    def __init__(self, model: str | None = None, **engine_options: Any) -> None:
        self.engine = LLMEngine(EngineConfig.from_flat(model=model, **engine_options))

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = LLMEngine(config)
        return llm

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Outputs in the order of `prompts`."""
        if isinstance(prompts, (str, Mapping)):
            prompts = [prompts]
        params = self._params_per_prompt(sampling_params, len(prompts))
        request_ids = []
        try:
            for prompt, p in zip(prompts, params):
                request_ids.append(self.engine.add_request(prompt, p).request_id)
            return self._run(request_ids)
        except BaseException:
            for request_id in request_ids:
                self.engine.abort_request(request_id)
            raise

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them."""
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else messages
        prompts = [self.engine.apply_chat_template(c) for c in conversations]
        return self.generate(prompts, sampling_params)

    @staticmethod
    def _params_per_prompt(
        sampling_params: SamplingParams | Sequence[SamplingParams] | None, num_prompts: int
    ) -> list[SamplingParams]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            return [sampling_params or SamplingParams()] * num_prompts
        if len(sampling_params) != num_prompts:
            raise ValueError("give one SamplingParams, or one per prompt")
        return list(sampling_params)

    def _run(self, request_ids: list[str]) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if output.finished:
                    finished[output.request_id] = output
        return [finished[request_id] for request_id in request_ids]
