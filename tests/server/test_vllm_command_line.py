"""A vLLM user's command line, served for real and asked with the official OpenAI SDK:
several served model names, a chat template from a file, vLLM's dtype, swap-space and
scheduling-policy spellings."""

from __future__ import annotations

import openai
import pytest

from superinfer.model.loader import default_model_path
from superinfer.model.tokenizer import load_tokenizer
from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow

TEMPLATE = "{% for m in messages %}Q: {{ m['content'] }}\nA:{% endfor %}"


@pytest.fixture(scope="module")
def vllm_style(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_style")
    (tmp / "template.jinja").write_text(TEMPLATE)
    proc = ServerProcess(
        tmp, "--served-model-name", "smol", "smol-alias", "--chat-template",
        str(tmp / "template.jinja"), "--generation-config", "vllm", "--dtype", "float",
        "--swap-space", "0.0625", "--scheduling-policy", "fcfs", "--max-model-len", "1024",
    )  # fmt: skip
    proc.start()
    yield proc
    assert proc.stop() == 0, proc.stderr_tail()


@pytest.fixture(scope="module")
def client(vllm_style):
    return openai.OpenAI(base_url=vllm_style.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_every_served_name(client):
    assert [m.id for m in client.models.list().data] == ["smol", "smol-alias"]


def test_any_served_name_answers_and_responses_carry_the_first(client):
    completion = client.completions.create(model="smol-alias", prompt="Hello", max_tokens=3)
    assert completion.model == "smol" and completion.usage.completion_tokens == 3
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="other", prompt="Hello", max_tokens=3)
    assert "'smol', 'smol-alias'" in str(error.value)


def test_the_chat_template_file_shapes_the_prompt(client):
    chat = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=4
    )
    tokenizer = load_tokenizer(default_model_path())
    expected = len(tokenizer("Q: Name a colour.\nA:")["input_ids"])
    assert chat.usage.prompt_tokens == expected


def test_vllm_spellings_reach_the_engine(vllm_style):
    log = vllm_style.stderr_path.read_text()
    assert "dtype float32 (--dtype float32)" in log  # --dtype float
    assert "policy fcfs-recompute" in log  # --scheduling-policy fcfs
    # --swap-space 0.0625 GiB of float32 blocks (30 layers x K,V x 16 tokens x 3 x 64 x 4 B)
    assert vllm_style.debug()["num_host_blocks"] == 2**30 // 16 // (30 * 2 * 16 * 3 * 64 * 4)
