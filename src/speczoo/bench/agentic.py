"""Agentic traces for the suite, built at run time from real files: what coding and tool-using agents send.

Three categories of multi-turn Spec-Bench questions (`question_id`, `category`, `turns`), each turn one chat
request that re-sends the whole conversation, the model's own earlier answers in it as assistant turns:

* `agentic_edit`: a chain of small edits to one real function. Every turn re-sends the file as the agent's
  tool would have left it after the edits asked so far (applied here, mechanically), asks for one more
  small edit (rename a name, add a comment line, rename the function, remove the comment) and asks for
  the whole edited code back.
* `agentic_quote`: tool results quoted back. Each turn carries a tool message (a grep over a real package,
  a directory listing with sizes and line counts, the head of a file) and asks to quote or summarise
  lines of it.
* `agentic_tools`: JSON tool calls turn after turn: the request carries OpenAI `tools` (read_file, grep,
  list_dir), the model answers with a call, the next turn carries the tool's real result and asks for
  the next call: the same JSON shapes over and over.

The files are the Python standard library's own sources (`sysconfig`'s stdlib folder), so a trace needs no
network and no download, and is the same on every run of one Python; `source` in each row names the
files. Extra Spec-Bench keys carry what a plain user turn cannot: `system` (a system message),
`tools` (OpenAI tool definitions, rendered by the model's chat template) and `tool_results` (one entry
per turn: the tool message sent before that turn's user message, or null); speczoo.bench.suite renders
them.

This module only builds questions: it never runs a model, never reads outside the standard library's
folder and never writes a file.
"""

from __future__ import annotations

import ast
import io
import re
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path

from speczoo.bench.questions import Question

NAME = "agentic"          # `speczoo suite --questions agentic`
CATEGORIES = ("agentic_edit", "agentic_quote", "agentic_tools")
FIRST_ID = 9001           # question ids of the traces: 9001, 9002, ... (clear of the built-in set's)

# Modules whose functions the edit chains take, and packages the quote and tool traces look into, in
# order; a module or package this Python lacks is passed over (the trace records what it used).
EDIT_MODULES = ("textwrap", "shlex", "fnmatch", "colorsys", "bisect", "heapq", "glob", "posixpath",
                "keyword", "reprlib")
PACKAGES = ("json", "email", "http", "urllib", "html", "logging", "importlib", "concurrent")
MIN_LINES, MAX_LINES, MAX_CHARS = 10, 28, 900   # an edited function fits a 256-token answer
GREP_LINES, HEAD_LINES = 24, 20

EDIT_ASK = "Reply with the whole edited code in one ```python block and nothing else."
COMMENT = "# agent: checked"
SYSTEM_TOOLS = ("You are a coding agent working in a Python checkout. Answer every request with exactly "
                "one tool call and no other text.")
TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read lines of a file of the checkout.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "path relative to the checkout"},
            "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
            "required": ["path", "start_line", "end_line"]}}},
    {"type": "function", "function": {
        "name": "grep", "description": "Search files for a regular expression; prints path:line:text.",
        "parameters": {"type": "object", "properties": {
            "pattern": {"type": "string"}, "path": {"type": "string"}},
            "required": ["pattern", "path"]}}},
    {"type": "function", "function": {
        "name": "list_dir", "description": "List a folder: name, size in bytes, lines.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
]


def stdlib_root() -> Path:
    """The folder of the standard library's Python sources."""
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass
class Snippet:
    path: str        # relative to the stdlib folder
    name: str        # the function's name
    code: str        # its source lines, as in the file
    arg: str         # its first parameter (renamed in the chain)


def find_snippets(root: Path, n: int) -> list[Snippet]:
    """The first function of MIN_LINES..MAX_LINES lines (≤ MAX_CHARS) with a parameter, in each of the
    first `n` EDIT_MODULES that have one."""
    found = []
    for module in EDIT_MODULES:
        path = root / f"{module}.py"
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.parse(source).body:
            if not isinstance(node, ast.FunctionDef) or not node.args.args:
                continue
            code = "\n".join(lines[node.lineno - 1:node.end_lineno])
            arg = node.args.args[0].arg
            if (MIN_LINES <= node.end_lineno - node.lineno + 1 <= MAX_LINES and len(code) <= MAX_CHARS
                    and len(arg) > 1):
                found.append(Snippet(path.name, node.name, code, arg))
                break
        if len(found) == n:
            break
    return found


def rename(code: str, old: str, new: str) -> str:
    """`old` renamed to `new` where it is a name of the code: not inside strings or comments, and not
    as an attribute (`w.wrap` keeps its `wrap`)."""
    lines = code.splitlines(keepends=True)
    spots, previous = [], None
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.NAME and tok.string == old and previous != ".":
            spots.append(tok.start)
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = tok.string
    for row, col in reversed(spots):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[col + len(old):]
    return "".join(lines)


def body_indent(code: str) -> str:
    second = code.splitlines()[1]
    return second[:len(second) - len(second.lstrip())]


def edit_chain(s: Snippet) -> list[tuple[str, str]]:
    """(instruction, the code it asks to edit) per turn; each edit is applied here, as a tool would."""
    new_arg, new_name = f"{s.arg}_in", f"{s.name}_v2"
    comment_line = body_indent(s.code) + COMMENT
    with_comment = lambda code: "\n".join([code.splitlines()[0], comment_line, *code.splitlines()[1:]])
    steps = [
        (f"Rename the parameter `{s.arg}` to `{new_arg}` everywhere in the function.",
         lambda code: rename(code, s.arg, new_arg)),
        (f"Add the comment line `{COMMENT}` as the first line of the function's body.", with_comment),
        (f"Rename the function `{s.name}` to `{new_name}`.", lambda code: rename(code, s.name, new_name)),
        (f"Remove the line `{COMMENT}`.", lambda code: code.replace(comment_line + "\n", "", 1)),
    ]
    out, code = [], s.code
    for instruction, apply in steps:
        out.append((instruction, code))
        code = apply(code)
    return out


def edit_question(qid: int, s: Snippet) -> Question:
    turns = [f"Here is the code of `{s.path}` you are editing, as it is now in the file:\n```python\n{code}\n```\n"
             f"{instruction} {EDIT_ASK}" for instruction, code in edit_chain(s)]
    return Question(qid, "agentic_edit", turns, {"source": [s.path]})


def py_files(root: Path, package: str) -> list[Path]:
    return sorted((root / package).glob("*.py"))


def grep(root: Path, pattern: str, package: str, limit: int = GREP_LINES) -> str:
    """`grep -n PATTERN package/*.py` as text, at most `limit` lines."""
    regex = re.compile(pattern)
    hits = []
    for path in py_files(root, package):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if regex.search(line):
                hits.append(f"{path.relative_to(root)}:{i}:{line.rstrip()}")
    return "\n".join(hits[:limit])


def list_dir(root: Path, package: str) -> str:
    """`name  size  lines` per .py file of the package, as a listing tool prints them."""
    rows = []
    for path in py_files(root, package):
        text = path.read_text(encoding="utf-8")
        rows.append(f"{path.name:<24} {len(text.encode()):>8} {text.count(chr(10)):>6}")
    return "name                         bytes  lines\n" + "\n".join(rows)


def read_lines(root: Path, path: str, start: int, end: int) -> str:
    lines = (root / path).read_text(encoding="utf-8").splitlines()
    return "\n".join(f"{i:>4}  {lines[i - 1]}" for i in range(start, min(end, len(lines)) + 1))


def quote_question(qid: int, root: Path, package: str) -> Question:
    files = py_files(root, package)
    first = files[0].relative_to(root).as_posix()
    tool_results = [grep(root, r"^\s*def ", package), list_dir(root, package),
                    read_lines(root, first, 1, HEAD_LINES)]
    turns = [f"Quote, exactly as they appear in the grep output, every line of `{first}`.",
             "Quote, exactly as they appear in the listing, the rows of the three largest files.",
             f"Summarise in two sentences what these lines of `{first}` do, then quote its import lines exactly."]
    return Question(qid, "agentic_quote", turns,
                    {"tool_results": tool_results, "source": [f.relative_to(root).as_posix() for f in files]})


def tools_question(qid: int, root: Path, package: str) -> Question:
    files = [f.relative_to(root).as_posix() for f in py_files(root, package)]
    first, last = files[0], files[-1]
    turns = [f"Show me lines 1 to {HEAD_LINES} of `{first}`.",
             f"Find every `def ` in the `{package}` package.",
             f"List the `{package}` folder.",
             f"Show me lines 1 to {HEAD_LINES} of `{last}`."]
    tool_results = [None, read_lines(root, first, 1, HEAD_LINES), grep(root, r"^\s*def ", package),
                    list_dir(root, package)]
    return Question(qid, "agentic_tools", turns,
                    {"system": SYSTEM_TOOLS, "tools": TOOLS, "tool_results": tool_results,
                     "source": [first, last]})


def agentic_questions(per_category: int = 3, root: Path | None = None) -> list[Question]:
    """`per_category` traces of each category (fewer where the standard library has fewer fitting files),
    ids from FIRST_ID, edit traces first. The same questions on every call with the same Python."""
    if per_category < 1:
        raise ValueError(f"per_category must be >= 1, got {per_category}")
    root = stdlib_root() if root is None else root
    packages = [p for p in PACKAGES if py_files(root, p)][:per_category]
    snippets = find_snippets(root, per_category)
    if not snippets or not packages:
        raise FileNotFoundError(f"no fitting Python sources under {root}: the agentic traces are built "
                                "from the standard library's .py files, which this Python lacks")
    questions = [edit_question(0, s) for s in snippets]
    questions += [quote_question(0, root, p) for p in packages]
    questions += [tools_question(0, root, p) for p in packages]
    for i, q in enumerate(questions):
        q.question_id = FIRST_ID + i
    return questions
