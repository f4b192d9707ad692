"""What clients commonly send besides the basics, through the official `openai` client against the shared server:
`n` choices (indexed 0..n-1, choice i sampled with seed s + i, streamed or not), `echo` (the prompt first; with
max_tokens 0 the prompt alone), `stream_options` (include_usage, continuous_usage_stats), and /openapi.json."""

from __future__ import annotations

import httpx

from suites.server.conftest import need_tokenizer

IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is"


def _texts(server, stream: bool, **kw) -> tuple[list[str], list]:
    """Each choice's text by index, and the usage (the last chunk's, when streamed)."""
    client = server.client()
    args = {"model": server.model, "prompt": IDS, "max_tokens": 6, "extra_body": {"ignore_eos": True}, **kw}
    if not stream:
        out = client.completions.create(**args)
        assert [c.index for c in out.choices] == list(range(len(out.choices)))
        return [c.text for c in out.choices], out.usage
    texts: dict[int, str] = {}
    usage = None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
        usage = chunk.usage or usage
    return [texts[i] for i in sorted(texts)], usage


def test_n_choices_use_seeds_s_s_plus_1(server):
    many, usage = _texts(server, False, n=3, temperature=1.0, seed=11)
    assert len(many) == 3 and usage.completion_tokens == 18 and usage.prompt_tokens == len(IDS)
    one_by_one = [_texts(server, False, temperature=1.0, seed=11 + i)[0][0] for i in range(3)]
    assert many == one_by_one
    assert len(set(many)) > 1  # three seeds: not three copies of one sample
    streamed, streamed_usage = _texts(server, True, n=3, temperature=1.0, seed=11)
    assert streamed == many and streamed_usage.completion_tokens == 18


def test_n_greedy_choices_agree(server):
    texts, _ = _texts(server, False, n=2, temperature=0)
    assert texts[0] == texts[1]


def test_chat_n_streams_a_role_per_choice(server):
    need_tokenizer(server)
    chunks = list(
        server.client().chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=4,
            n=2,
            seed=3,
            temperature=1.0,
            stream=True,
        )
    )
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1]
    assert {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason} == {0, 1}


def test_echo_puts_the_prompt_first(server):
    need_tokenizer(server)
    client = server.client()
    prompt = "The capital of France is"
    plain = client.completions.create(model=server.model, prompt=prompt, max_tokens=4, temperature=0)
    echoed = client.completions.create(model=server.model, prompt=prompt, max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    alone = client.completions.create(model=server.model, prompt=prompt, max_tokens=0, echo=True)
    assert alone.choices[0].text == prompt and alone.choices[0].finish_reason == "length"
    assert alone.usage.completion_tokens == 0 and alone.usage.prompt_tokens == len(IDS)
    ids = client.completions.create(model=server.model, prompt=IDS, max_tokens=0, echo=True)
    assert ids.choices[0].text == prompt  # a token-id prompt is echoed as its text


def test_continuous_usage_counts_each_choice_so_far(server):
    chunks = list(
        server.client().completions.create(
            model=server.model,
            prompt=IDS,
            max_tokens=5,
            n=2,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
    )
    per_choice: dict[int, list[int]] = {0: [], 1: []}
    for chunk in chunks[:-1]:
        assert chunk.usage.prompt_tokens == len(IDS)
        per_choice[chunk.choices[0].index].append(chunk.usage.completion_tokens)
    # one chunk per engine step ([1, 2, 3, 4, 5]) unless the stream fell behind (a busy machine): then the steps
    # queued meanwhile come as one chunk, and a count is skipped
    for counts in per_choice.values():
        assert counts == sorted(set(counts)) and counts[0] >= 1 and counts[-1] == 5, per_choice
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_openapi_schema_describes_the_endpoints(server):
    schema = httpx.get(server.base_url + "/openapi.json", timeout=30).json()
    paths = schema["paths"]
    assert set(paths) == {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}
    refs = {
        "/v1/completions": ("CompletionRequest", "Completion"),
        "/v1/chat/completions": ("ChatCompletionRequest", "ChatCompletion"),
    }
    for path, (request, response) in refs.items():
        post = paths[path]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + request)
        assert post["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + response)
        assert "text/event-stream" in post["responses"]["200"]["content"]
        assert "400" in post["responses"] and "422" not in post["responses"]
    schemas = schema["components"]["schemas"]
    assert schemas["CompletionRequest"]["properties"]["logprobs"]["anyOf"][0]["maximum"] == 5
    assert schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] == [server.model]
    event = paths["/v1/chat/completions"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    chunk = event["properties"]["data"]["anyOf"][1]["contentSchema"]["anyOf"][0]["$ref"]
    assert chunk.endswith("/ChatCompletionChunk") and "ChatCompletionChunk" in schemas
    assert "ErrorBody" in schemas and "ModelList" in schemas
