"""The long-document scenario (shared/seeds/004_*.txt): a long markdown table, then two questions.

The second question reuses the cached table: only its own few tokens are prefilled.

    .venv/bin/python examples/long_document.py [--model DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni import Omni, SamplingParams  # noqa: E402

PEOPLE = [
    ("John Doe", 29, "Engineer", "USA"),
    ("Jane Smith", 34, "Doctor", "Canada"),
    ("Alice Johnson", 27, "Teacher", "UK"),
    ("Bob Brown", 45, "Artist", "Australia"),
    ("Carol White", 31, "Scientist", "New Zealand"),
    ("Dave Green", 28, "Lawyer", "Ireland"),
    ("Emma Black", 40, "Musician", "USA"),
    ("Frank Blue", 37, "Chef", "Canada"),
    ("Grace Yellow", 50, "Engineer", "UK"),
    ("Henry Violet", 32, "Artist", "Australia"),
    ("Irene Orange", 26, "Scientist", "New Zealand"),
    ("Jack Indigo", 38, "Teacher", "Ireland"),
    ("Karen Red", 41, "Lawyer", "USA"),
    ("Leo Brown", 30, "Chef", "Canada"),
    ("Mia Green", 33, "Musician", "UK"),
    ("Noah Yellow", 29, "Doctor", "Australia"),
    ("Olivia Blue", 35, "Engineer", "New Zealand"),
    ("Peter Black", 42, "Artist", "Ireland"),
    ("Quinn White", 28, "Scientist", "USA"),
    ("Rachel Red", 31, "Teacher", "Canada"),
    ("Steve Green", 44, "Lawyer", "UK"),
    ("Tina Blue", 36, "Musician", "Australia"),
    ("Umar Black", 39, "Chef", "New Zealand"),
    ("Victor Yellow", 43, "Engineer", "Ireland"),
    ("Wendy Orange", 27, "Artist", "USA"),
    ("Xavier Green", 34, "Scientist", "Canada"),
    ("Yara Red", 41, "Teacher", "UK"),
    ("Zack Blue", 30, "Lawyer", "Australia"),
    ("Amy White", 33, "Musician", "New Zealand"),
    ("Ben Black", 38, "Chef", "Ireland"),
]


def long_prompt() -> str:
    rows = [
        f"| {i} | {name} | {age} | {job} | {country} | {name.split()[0].lower()}@example.com |"
        for i, (name, age, job, country) in enumerate(PEOPLE, start=1)
    ]
    return (
        "You are a helpful assistant in recognizes the content of tables in markdown format. "
        "Here is a table as follows.\n# Table\n"
        "| ID | Name | Age | Occupation | Country | Email |\n| --- | --- | --- | --- | --- | --- |\n"
        + "\n".join(rows)
        + "\n"
    )


def question(name: str) -> str:
    return f"Question: what is the age of {name}? Your answer: The age of {name} is "


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="a causal LM checkpoint directory (default: tiny qwen2)")
    args = parser.parse_args()
    if args.model is None:
        from tools.make_tiny_checkpoint import ensure_checkpoint

        args.model = str(ensure_checkpoint("qwen2", "tiny"))
    params = SamplingParams(temperature=0.0, max_tokens=24)
    with Omni(model=args.model, runtime={"backend": "local"}) as llm:
        for name in ("John Doe", "Zack Blue"):
            start = time.perf_counter()
            output = llm.generate(long_prompt() + question(name), params, use_tqdm=False)[0]
            elapsed = time.perf_counter() - start
            final = output.final
            print(
                f"Question about {name}: {final.num_prompt_tokens} prompt tokens, "
                f"{final.num_cached_tokens} served from the prefix cache"
            )
            print(f"  output: {final.text!r}")
            print(f"  generation time: {elapsed:.3f} s")


if __name__ == "__main__":
    main()
