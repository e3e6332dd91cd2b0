"""Write ``data/agent_edits.jsonl``: a coding agent's stream of requests on the same files.

Each session is one Python file edited turn after turn. Every request is a new, stateless
conversation (as an agent's tool call is): it resends the whole current file and asks for one
edit, the complete updated file in reply. The file of request ``k`` has edits ``1..k-1`` applied
(what a correct agent would have produced), so consecutive requests share most of their text and
their answers: state carried across requests (a shared index of past answers) can draft request
``k``'s answer from request ``k-1``'s.

Run from the repository root: ``python data/make_agent_edits.py`` (deterministic; the output is
committed).
"""

from __future__ import annotations

import json
from pathlib import Path

PROMPT = (
    "You are a coding agent working on the file `{name}`. Its current content:\n\n"
    "```python\n{code}```\n\n"
    "Task: {task}\n\n"
    "Reply with the complete updated file in a single ```python code block, then one sentence saying what "
    "you changed."
)

INVENTORY = """\
from dataclasses import dataclass


@dataclass
class Item:
    sku: str
    name: str
    price: float
    quantity: int


def add_item(inventory, item):
    if item.sku in inventory:
        inventory[item.sku].quantity += item.quantity
    else:
        inventory[item.sku] = item
    return inventory


def find(inventory, sku):
    return inventory.get(sku)


def total_value(inventory):
    total = 0.0
    for item in inventory.values():
        total += item.price * item.quantity
    return total


def low_stock(inventory, threshold=5):
    return [item for item in inventory.values() if item.quantity < threshold]


def restock(inventory, sku, amount):
    item = inventory[sku]
    item.quantity += amount
    return item
"""

INVENTORY_EDITS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "Add a function `remove_item(inventory, sku)` after `add_item` that deletes the item and "
        "raises a KeyError naming the SKU when it is missing.",
        [
            (
                "    return inventory\n\n\ndef find(",
                "    return inventory\n\n\n"
                "def remove_item(inventory, sku):\n"
                "    if sku not in inventory:\n"
                '        raise KeyError(f"unknown SKU: {sku}")\n'
                "    del inventory[sku]\n"
                "    return inventory\n\n\n"
                "def find(",
            )
        ],
    ),
    (
        "Rename `find` to `find_by_sku` and add `find_by_name(inventory, name)` after it, which returns "
        "every item whose name contains `name`, ignoring case.",
        [
            (
                "def find(inventory, sku):\n    return inventory.get(sku)\n",
                "def find_by_sku(inventory, sku):\n    return inventory.get(sku)\n\n\n"
                "def find_by_name(inventory, name):\n"
                "    wanted = name.lower()\n"
                "    return [item for item in inventory.values() if wanted in item.name.lower()]\n",
            )
        ],
    ),
    (
        'Add a `category: str = "general"` field to `Item` and a function `by_category(inventory)` at the '
        "end of the file that returns a dict from each category to the list of its items.",
        [
            ("    quantity: int\n", '    quantity: int\n    category: str = "general"\n'),
            (
                "    item.quantity += amount\n    return item\n",
                "    item.quantity += amount\n    return item\n\n\n"
                "def by_category(inventory):\n"
                "    groups = {}\n"
                "    for item in inventory.values():\n"
                "        groups.setdefault(item.category, []).append(item)\n"
                "    return groups\n",
            ),
        ],
    ),
    (
        "`restock` must reject a non-positive amount: raise a ValueError that names the amount.",
        [
            (
                "def restock(inventory, sku, amount):\n    item = inventory[sku]\n",
                "def restock(inventory, sku, amount):\n"
                "    if amount <= 0:\n"
                '        raise ValueError(f"restock amount must be positive, got {amount}")\n'
                "    item = inventory[sku]\n",
            )
        ],
    ),
    (
        "Add a module-level logger (`logging.getLogger(__name__)`) and log every added and removed item at INFO level.",
        [
            (
                "from dataclasses import dataclass\n",
                "import logging\nfrom dataclasses import dataclass\n\nlogger = logging.getLogger(__name__)\n",
            ),
            (
                "        inventory[item.sku] = item\n    return inventory\n",
                '        inventory[item.sku] = item\n    logger.info("added %s x%d", item.sku, item.quantity)\n'
                "    return inventory\n",
            ),
            (
                "    del inventory[sku]\n",
                '    del inventory[sku]\n    logger.info("removed %s", sku)\n',
            ),
        ],
    ),
    (
        "Add type hints to every function (the inventory is a `dict[str, Item]`).",
        [
            (
                "def add_item(inventory, item):",
                "def add_item(inventory: dict[str, Item], item: Item) -> dict[str, Item]:",
            ),
            (
                "def remove_item(inventory, sku):",
                "def remove_item(inventory: dict[str, Item], sku: str) -> dict[str, Item]:",
            ),
            (
                "def find_by_sku(inventory, sku):",
                "def find_by_sku(inventory: dict[str, Item], sku: str) -> Item | None:",
            ),
            (
                "def find_by_name(inventory, name):",
                "def find_by_name(inventory: dict[str, Item], name: str) -> list[Item]:",
            ),
            ("def total_value(inventory):", "def total_value(inventory: dict[str, Item]) -> float:"),
            (
                "def low_stock(inventory, threshold=5):",
                "def low_stock(inventory: dict[str, Item], threshold: int = 5) -> list[Item]:",
            ),
            (
                "def restock(inventory, sku, amount):",
                "def restock(inventory: dict[str, Item], sku: str, amount: int) -> Item:",
            ),
            ("def by_category(inventory):", "def by_category(inventory: dict[str, Item]) -> dict[str, list[Item]]:"),
        ],
    ),
]

TEXTSTATS = """\
import argparse
from collections import Counter


def read_text(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def count_words(text):
    return Counter(text.split())


def top_words(counts, n):
    return counts.most_common(n)


def format_report(pairs):
    lines = []
    for word, count in pairs:
        lines.append(f"{word}\\t{count}")
    return "\\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description="Count the words of a text file.")
    parser.add_argument("path")
    args = parser.parse_args()
    counts = count_words(read_text(args.path))
    print(format_report(top_words(counts, 10)))


main()
"""

TEXTSTATS_EDITS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "Make `count_words` ignore case: `The` and `the` are the same word.",
        [("    return Counter(text.split())\n", "    return Counter(word.lower() for word in text.split())\n")],
    ),
    (
        "Add a `--top N` option (an int, default 10) and print that many words instead of always 10.",
        [
            (
                '    parser.add_argument("path")\n',
                '    parser.add_argument("path")\n'
                '    parser.add_argument("--top", type=int, default=10, help="how many words to print")\n',
            ),
            ("top_words(counts, 10)", "top_words(counts, args.top)"),
        ],
    ),
    (
        "Strip punctuation from the words before counting them, with `str.translate` and `string.punctuation`.",
        [
            (
                "import argparse\nfrom collections import Counter\n",
                "import argparse\nimport string\nfrom collections import Counter\n\n"
                'PUNCTUATION = str.maketrans("", "", string.punctuation)\n',
            ),
            (
                "    return Counter(word.lower() for word in text.split())\n",
                "    words = (word.translate(PUNCTUATION).lower() for word in text.split())\n"
                "    return Counter(word for word in words if word)\n",
            ),
        ],
    ),
    (
        "Accept several files: `path` becomes `paths` (one or more), and a new function `read_files(paths)` "
        "returns their texts joined by newlines.",
        [
            (
                "        return handle.read()\n",
                "        return handle.read()\n\n\n"
                "def read_files(paths):\n"
                '    return "\\n".join(read_text(path) for path in paths)\n',
            ),
            ('    parser.add_argument("path")\n', '    parser.add_argument("paths", nargs="+")\n'),
            ("count_words(read_text(args.path))", "count_words(read_files(args.paths))"),
            ("Count the words of a text file.", "Count the words of text files."),
        ],
    ),
    (
        "In `read_files`, skip a file that is not valid UTF-8 and print a warning naming it to stderr.",
        [
            ("import argparse\nimport string\n", "import argparse\nimport string\nimport sys\n"),
            (
                'def read_files(paths):\n    return "\\n".join(read_text(path) for path in paths)\n',
                "def read_files(paths):\n"
                "    texts = []\n"
                "    for path in paths:\n"
                "        try:\n"
                "            texts.append(read_text(path))\n"
                "        except UnicodeDecodeError:\n"
                '            print(f"warning: skipping {path}: not UTF-8", file=sys.stderr)\n'
                '    return "\\n".join(texts)\n',
            ),
        ],
    ),
    (
        "Make `main` return an exit code (0) and call it only when the file is run as a script: "
        '`if __name__ == "__main__": sys.exit(main())`.',
        [
            (
                "    print(format_report(top_words(counts, args.top)))\n\n\nmain()\n",
                "    print(format_report(top_words(counts, args.top)))\n    return 0\n\n\n"
                'if __name__ == "__main__":\n    sys.exit(main())\n',
            )
        ],
    ),
]

SESSIONS = (("inventory.py", INVENTORY, INVENTORY_EDITS), ("textstats.py", TEXTSTATS, TEXTSTATS_EDITS))


def apply(code: str, replacements: list[tuple[str, str]]) -> str:
    for old, new in replacements:
        if code.count(old) != 1:
            raise SystemExit(f"edit does not apply once: {old!r} occurs {code.count(old)} times")
        code = code.replace(old, new)
    return code


def rows() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for name, code, edits in SESSIONS:
        stem = name.removesuffix(".py")
        for number, (task, replacements) in enumerate(edits, start=1):
            out.append(
                {
                    "question_id": f"{stem}-{number}",
                    "category": f"agent-{stem}",
                    "file": name,
                    "edit": number,
                    "turns": [PROMPT.format(name=name, code=code, task=task)],
                }
            )
            code = apply(code, replacements)
    return out


if __name__ == "__main__":
    target = Path(__file__).resolve().parent / "agent_edits.jsonl"
    target.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows()), encoding="utf-8")
    print(f"wrote {target}")
