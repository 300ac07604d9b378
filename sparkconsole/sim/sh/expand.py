"""Word expansion as POSIX ``sh`` does it: tilde, parameters (``$V``, ``${V:-d}`` and friends),
command substitution (``$(...)``, backquotes), arithmetic (``$((...))``), field splitting of
unquoted results, pathname expansion and quote removal.

The expander asks its shell (the :class:`Env` protocol) for variables, for ``$(...)`` output and
for glob matches, so it holds no state of its own.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import re
from typing import Protocol

from sparkconsole.sim.sh.parse import _scan_backtick, _scan_balanced, _scan_dquote


class ExpandError(Exception):
    """``${V:?msg}``, a bad substitution or bad arithmetic: dash prints it and the command fails."""


class Env(Protocol):
    def getvar(self, name: str) -> str | None: ...
    def setvar(self, name: str, value: str) -> None: ...
    async def command_subst(self, script: str) -> str: ...
    def glob(self, pattern: str) -> list[str]: ...


Seg = tuple[str, bool, bool]  # (text, quoted, literal: from the source, not an expansion)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPECIAL = "?!$#@*-0123456789"


_PLAIN = re.compile(r"[^\\'\"`$]*")  # a word with nothing to expand: its characters as they are


async def segments(env: Env, word: str, in_dquote: bool = False, tilde: bool = True) -> list[Seg]:
    if _PLAIN.fullmatch(word) and not (tilde and not in_dquote and word[:1] == "~"):
        return [(word, in_dquote, True)] if word else []  # what the loop below makes of it, at once
    out: list[Seg] = []
    i, n = 0, len(word)
    if tilde and not in_dquote and (word == "~" or word.startswith("~/")):
        # $HOME, else the home of the user the shell runs as (the node's login user: /home/nvidia)
        out.append((env.getvar("HOME") or getattr(getattr(env, "account", None), "home", "/"), True, False))
        i = 1
    lit: list[str] = []

    def flush() -> None:
        if lit:
            out.append(("".join(lit), in_dquote, True))
            lit.clear()

    while i < n:
        ch = word[i]
        if ch == "\\":
            nxt = word[i + 1:i + 2]
            if in_dquote and nxt not in ('$', '`', '"', "\\", "\n"):
                lit.append("\\")
                i += 1
                continue
            flush()
            if nxt != "\n":
                out.append((nxt, True, True))
            i += 2
            continue
        if ch == "'" and not in_dquote:
            flush()
            j = word.index("'", i + 1)
            out.append((word[i + 1:j], True, True))
            if j == i + 1:
                out.append(("", True, True))
            i = j + 1
            continue
        if ch == '"' and not in_dquote:
            flush()
            j = _scan_dquote(word, i + 1)
            inner = await segments(env, word[i + 1:j - 1], in_dquote=True)
            out.extend(inner or [("", True, True)])
            if not inner:
                pass
            i = j
            continue
        if ch == "`":
            flush()
            j = _scan_backtick(word, i + 1)
            script = re.sub(r"\\([$`\\])", r"\1", word[i + 1:j - 1])
            out.append((await env.command_subst(script), in_dquote, False))
            i = j
            continue
        if ch == "$":
            if word.startswith("$((", i):
                flush()
                j = _scan_balanced(word, i + 3, "(", ")")
                if word[j:j + 1] == ")":
                    expr = word[i + 3:j - 1]
                    text = "".join(s for s, _q, _l in await segments(env, expr, in_dquote=True))
                    out.append((str(arith(text, env)), in_dquote, False))
                    i = j + 1
                    continue
                # $( (subshell) ): a command substitution after all
                j = _scan_balanced(word, i + 2, "(", ")")
                out.append((await env.command_subst(word[i + 2:j - 1]), in_dquote, False))
                i = j
                continue
            if word.startswith("$(", i):
                flush()
                j = _scan_balanced(word, i + 2, "(", ")")
                out.append((await env.command_subst(word[i + 2:j - 1]), in_dquote, False))
                i = j
                continue
            if word.startswith("${", i):
                flush()
                j = _scan_balanced(word, i + 2, "{", "}")
                out.append((await _brace(env, word[i + 2:j - 1]), in_dquote, False))
                i = j
                continue
            m = _NAME.match(word, i + 1)
            if m:
                flush()
                out.append((env.getvar(m.group(0)) or "", in_dquote, False))
                i = m.end()
                continue
            if i + 1 < n and word[i + 1] in _SPECIAL:
                flush()
                out.append((env.getvar(word[i + 1]) or "", in_dquote, False))
                i += 2
                continue
        lit.append(ch)
        i += 1
    flush()
    return out


async def _brace(env: Env, body: str) -> str:
    if body.startswith("#") and len(body) > 1:
        return str(len(env.getvar(body[1:]) or ""))
    m = _NAME.match(body) or (re.match(r"[0-9]+|[?!$#@*-]", body))  # ${10}: the tenth positional parameter
    if not m:
        raise ExpandError(f"${{{body}}}: Bad substitution")
    name = m.group(0)
    rest = body[m.end():]
    val = env.getvar(name)
    if not rest:
        return val or ""
    colon = rest.startswith(":")
    op = rest[1:2] if colon else rest[:1]
    arg_raw = rest[2:] if colon else rest[1:]
    if op in ("%", "#"):
        double = arg_raw.startswith(op)
        pat_raw = arg_raw[1:] if double else arg_raw
        pat = "".join(s for s, _q, _l in await segments(env, pat_raw, tilde=False))
        v = val or ""
        return _trim(v, pat, op, double)
    if op not in ("-", "=", "+", "?"):
        raise ExpandError(f"${{{body}}}: Bad substitution")
    unset = val is None or (colon and val == "")

    async def arg() -> str:
        return "".join(s for s, _q, _l in await segments(env, arg_raw))

    if op == "-":
        return await arg() if unset else val or ""
    if op == "=":
        if unset:
            v = await arg()
            env.setvar(name, v)
            return v
        return val or ""
    if op == "+":
        return "" if unset else await arg()
    if unset:
        msg = await arg()
        raise ExpandError(f"{name}: {msg or 'parameter not set'}")
    return val or ""


def _trim(v: str, pat: str, op: str, longest: bool) -> str:
    rng = range(len(v) + 1)
    if op == "#":
        cuts = [k for k in rng if fnmatch.fnmatchcase(v[:k], pat)]
        if not cuts:
            return v
        return v[(max(cuts) if longest else min(cuts)):]
    cuts = [k for k in rng if fnmatch.fnmatchcase(v[k:], pat)]
    if not cuts:
        return v
    return v[:(min(cuts) if longest else max(cuts))]


def _magic(field: list[Seg]) -> bool:
    """Whether a field is a pattern: an unquoted ``*`` or ``?``, or an unquoted ``[`` that a ``]``
    closes later in the field. A ``[`` alone is an ordinary character (POSIX 2.13.1): the ``[``
    command (``[ -e FILE ]``) is not matched against the directory."""
    text, opens = "", []
    for s, quoted, _l in field:
        if not quoted:
            if "*" in s or "?" in s:
                return True
            opens += [len(text) + i for i, c in enumerate(s) if c == "["]
        text += s
    # the first character of a bracket expression (after a ``!``) is never its end: ``[]`` alone is literal
    return any("]" in text[i + (3 if text[i + 1:i + 2] == "!" else 2):] for i in opens)


def _glob_escape(s: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in s)


async def expand_word(env: Env, word: str, split: bool = True, glob: bool = True) -> list[str]:
    """One source word to its fields (POSIX rules). ``"$@"`` is modelled as a whole word only (each
    positional parameter one field, none for none: a function passing its arguments on, ``x() {
    …; "$@"; }``); inside a longer word it expands like ``"$*"``."""
    if word == '"$@"':
        return list(env.params)
    segs = await segments(env, word)
    fields: list[list[Seg]] = [[]]
    has_quote = [False]
    for text, quoted, literal in segs:
        if quoted:
            has_quote[-1] = True
        if split and not quoted and not literal:
            parts = re.split(r"[ \t\n]+", text)
            for k, part in enumerate(parts):
                if k:
                    fields.append([])
                    has_quote.append(False)
                if part:
                    fields[-1].append((part, False, False))
            continue
        fields[-1].append((text, quoted, literal))
    out: list[str] = []
    for f, q in zip(fields, has_quote, strict=True):
        if not f and not q:
            continue
        plain = "".join(s for s, _q, _l in f)
        magic = glob and _magic(f)
        if magic:
            pattern = "".join(s if not quoted else _glob_escape(s) for s, quoted, _l in f)
            hits = env.glob(pattern)
            if hits:
                out.extend(hits)
                continue
        out.append(plain)
    return out


async def expand_str(env: Env, word: str) -> str:
    """A word expanded to one string: assignments, redirection targets, ``case`` words."""
    return "".join(s for s, _q, _l in await segments(env, word))


async def expand_heredoc(env: Env, body: str) -> str:
    """A heredoc body with an unquoted delimiter: ``$``, backquotes and ``\\`` are live, quotes are not."""
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and body[i + 1:i + 2] in ("$", "`", "\\"):
            out.append(body[i + 1])
            i += 2
            continue
        if ch == "\\" and body[i + 1:i + 2] == "\n":
            i += 2
            continue
        if ch in "$`":
            # expand just this expansion, as if double-quoted
            j = _expansion_end(body, i)
            out.append("".join(s for s, _q, _l in await segments(env, body[i:j], in_dquote=True)))
            i = j
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _expansion_end(s: str, i: int) -> int:
    if s[i] == "`":
        return _scan_backtick(s, i + 1)
    if s.startswith("$((", i) or s.startswith("$(", i):
        j = _scan_balanced(s, i + 2, "(", ")")
        return j
    if s.startswith("${", i):
        return _scan_balanced(s, i + 2, "{", "}")
    m = _NAME.match(s, i + 1)
    if m:
        return m.end()
    return i + 2 if i + 1 < len(s) and s[i + 1] in _SPECIAL else i + 1


# ---- arithmetic --------------------------------------------------------------------------------

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: None, ast.Div: None,
        ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
        ast.BitOr: operator.or_, ast.BitXor: operator.xor}
_CMP = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
        ast.Eq: operator.eq, ast.NotEq: operator.ne}


def arith(expr: str, env: Env) -> int:
    """``$((expr))``: integers, + - * / % << >> & | ^, comparisons, && || !, parentheses, names."""
    src = expr.strip()
    if not src:
        return 0
    src = re.sub(r"&&", " and ", src)
    src = re.sub(r"\|\|", " or ", src)
    src = re.sub(r"!(?!=)", " not ", src)

    def name_value(m: re.Match[str]) -> str:
        if m.group(0) in ("and", "or", "not"):
            return m.group(0)
        v = (env.getvar(m.group(0)) or "0").strip() or "0"
        if not re.fullmatch(r"-?\d+", v):
            raise ExpandError(f"arithmetic expression: expecting primary: \"{expr}\"")
        return f"({v})"

    src = re.sub(r"[A-Za-z_][A-Za-z0-9_]*", name_value, src)
    try:
        tree = ast.parse(src, mode="eval")
        return int(_eval(tree.body))
    except (SyntaxError, ZeroDivisionError, TypeError, ValueError) as exc:
        if isinstance(exc, ZeroDivisionError):
            raise ExpandError("arithmetic expression: division by zero") from None
        raise ExpandError(f"arithmetic expression: expecting primary: \"{expr}\"") from None


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand)
        if isinstance(node.op, ast.USub):
            return -v
        if isinstance(node.op, ast.UAdd):
            return v
        if isinstance(node.op, ast.Not):
            return int(not v)
        if isinstance(node.op, ast.Invert):
            return ~v
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div | ast.Mod):
            if b == 0:
                raise ZeroDivisionError
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
            return q if isinstance(node.op, ast.Div) else a - q * b
        return _BIN[type(node.op)](a, b)  # type: ignore[misc]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
        return int(_CMP[type(node.ops[0])](_eval(node.left), _eval(node.comparators[0])))
    if isinstance(node, ast.BoolOp):
        vals = [_eval(v) for v in node.values]
        return int(all(vals)) if isinstance(node.op, ast.And) else int(any(vals))
    raise ValueError("unsupported")
