"""The POSIX ``sh`` grammar the sim understands: lexer and parser into a small syntax tree.

Words keep their quotes (``"$HOME"/x``, ``'a b'``, ``$(cmd)``); :mod:`.expand` removes them when
the word is expanded, as ``sh`` does. Supported: lists (``;``, ``&``, newline), ``&&``/``||``,
pipelines (``!``), simple commands with assignments and redirections (``<``, ``>``, ``>>``,
``>|``, ``<>``, ``N>&M``, ``N<&M``, heredocs ``<<`` / ``<<-`` with quoted or plain delimiters),
``if/elif/else``, ``for``, ``while``/``until``, ``{ ...; }``, ``( ... )``, ``case`` and
``name() { ...; }`` functions, and ``#`` comments. Syntax errors carry dash's wording
(``Syntax error: "fi" unexpected``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

OPERATORS = ("&&", "||", ";;", "<<-", "<<", ">>", ">&", "<&", ">|", "<>", ";", "&", "|", "(", ")", "<", ">")
RESERVED = {"if", "then", "elif", "else", "fi", "for", "in", "do", "done", "while", "until", "case", "esac",
            "{", "}", "!"}


class ShSyntaxError(Exception):
    """A script that does not parse; the message is dash's (after ``sh: LINE: ``)."""

    def __init__(self, msg: str, line: int = 1) -> None:
        super().__init__(msg)
        self.line = line


@dataclass
class HereDoc:
    delim: str
    quoted: bool
    strip_tabs: bool
    body: str = ""


@dataclass
class Tok:
    kind: str  # WORD | OP | NL | IO | EOF
    value: str
    line: int = 1
    heredoc: HereDoc | None = None


@dataclass
class Redir:
    fd: int
    op: str  # < > >> >| <> >& <& <<
    target: str | HereDoc


@dataclass
class Simple:
    assigns: list[str]
    words: list[str]
    redirs: list[Redir]
    line: int = 1


@dataclass
class Pipeline:
    cmds: list[Node]
    bang: bool = False


@dataclass
class AndOr:
    first: Pipeline
    rest: list[tuple[str, Pipeline]] = field(default_factory=list)


@dataclass
class ListNode:
    items: list[tuple[AndOr, bool]] = field(default_factory=list)  # (and-or, run in background)


@dataclass
class If:
    clauses: list[tuple[ListNode, ListNode]]
    else_: ListNode | None
    redirs: list[Redir] = field(default_factory=list)


@dataclass
class For:
    var: str
    words: list[str] | None  # None: "$@"
    body: ListNode
    redirs: list[Redir] = field(default_factory=list)


@dataclass
class Loop:
    cond: ListNode
    body: ListNode
    until: bool = False
    redirs: list[Redir] = field(default_factory=list)


@dataclass
class Group:
    body: ListNode
    subshell: bool = False
    redirs: list[Redir] = field(default_factory=list)


@dataclass
class Case:
    word: str
    arms: list[tuple[list[str], ListNode]]
    redirs: list[Redir] = field(default_factory=list)


@dataclass
class FuncDef:
    name: str
    body: Node


Node = Simple | If | For | Loop | Group | Case | FuncDef


# ---- lexer ---------------------------------------------------------------------------------------


def _scan_balanced(src: str, i: int, open_: str, close: str) -> int:
    """Index just past the ``close`` matching the ``open_`` before ``i`` (quotes respected)."""
    depth = 1
    while i < len(src):
        ch = src[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "'":
            j = src.find("'", i + 1)
            if j < 0:
                raise ShSyntaxError("Syntax error: Unterminated quoted string")
            i = j + 1
            continue
        if ch == '"':
            i = _scan_dquote(src, i + 1)
            continue
        if ch == "`":
            i = _scan_backtick(src, i + 1)
            continue
        if ch == open_:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ShSyntaxError(f'Syntax error: end of file unexpected (expecting "{close}")')


def _scan_backtick(src: str, i: int) -> int:
    while i < len(src):
        if src[i] == "\\":
            i += 2
            continue
        if src[i] == "`":
            return i + 1
        i += 1
    raise ShSyntaxError('Syntax error: EOF in backquote substitution')


def _scan_dquote(src: str, i: int) -> int:
    """Index just past the closing double quote; ``i`` is just after the opening one."""
    while i < len(src):
        ch = src[i]
        if ch == "\\":
            i += 2
            continue
        if ch == '"':
            return i + 1
        if ch == "$" and src[i + 1:i + 2] == "(":
            i = _scan_balanced(src, i + 2, "(", ")")
            continue
        if ch == "$" and src[i + 1:i + 2] == "{":
            i = _scan_balanced(src, i + 2, "{", "}")
            continue
        if ch == "`":
            i = _scan_backtick(src, i + 1)
            continue
        i += 1
    raise ShSyntaxError("Syntax error: Unterminated quoted string")


def tokenize(src: str) -> list[Tok]:
    toks: list[Tok] = []
    pending: list[HereDoc] = []
    i, line, n = 0, 1, len(src)
    want_delim: tuple[bool] | None = None  # after << / <<-: strip tabs?
    while i < n:
        ch = src[i]
        if ch in " \t":
            i += 1
            continue
        if ch == "\\" and src[i + 1:i + 2] == "\n":
            i += 2
            line += 1
            continue
        if ch == "#":
            while i < n and src[i] != "\n":
                i += 1
            continue
        if ch == "\n":
            toks.append(Tok("NL", "\n", line))
            i += 1
            line += 1
            for hd in pending:
                i, line = _read_heredoc(src, i, line, hd)
            pending = []
            continue
        op = next((o for o in OPERATORS if src.startswith(o, i)), None)
        if op is not None:
            toks.append(Tok("OP", op, line))
            i += len(op)
            if op in ("<<", "<<-"):
                want_delim = (op == "<<-",)
            continue
        # a word
        j = i
        while j < n:
            c = src[j]
            if c in " \t\n;&|<>()":
                break
            if c == "\\":
                j += 2
            elif c == "'":
                k = src.find("'", j + 1)
                if k < 0:
                    raise ShSyntaxError("Syntax error: Unterminated quoted string", line)
                j = k + 1
            elif c == '"':
                j = _scan_dquote(src, j + 1)
            elif c == "`":
                j = _scan_backtick(src, j + 1)
            elif c == "$" and src[j + 1:j + 2] == "(":
                j = _scan_balanced(src, j + 2, "(", ")")
            elif c == "$" and src[j + 1:j + 2] == "{":
                j = _scan_balanced(src, j + 2, "{", "}")
            else:
                j += 1
        word = src[i:j]
        line += word.count("\n")
        if want_delim is not None:
            quoted = any(q in word for q in "'\"\\")
            delim = word.replace("'", "").replace('"', "").replace("\\", "")
            hd = HereDoc(delim, quoted, want_delim[0])
            pending.append(hd)
            toks.append(Tok("WORD", word, line, heredoc=hd))
            want_delim = None
        elif word.isdigit() and j < n and src[j] in "<>":
            toks.append(Tok("IO", word, line))
        else:
            toks.append(Tok("WORD", word, line))
        i = j
    if pending:
        # a heredoc on the last line with no newline after it: its body is empty (dash warns)
        for hd in pending:
            hd.body = ""
    toks.append(Tok("EOF", "", line))
    return toks


def _read_heredoc(src: str, i: int, line: int, hd: HereDoc) -> tuple[int, int]:
    body: list[str] = []
    while i < len(src):
        j = src.find("\n", i)
        raw = src[i:] if j < 0 else src[i:j]
        i = len(src) if j < 0 else j + 1
        line += 1
        cmp = raw.lstrip("\t") if hd.strip_tabs else raw
        if cmp == hd.delim:
            hd.body = "".join(body)
            return i, line
        body.append(cmp + "\n")
    hd.body = "".join(body)
    return i, line


# ---- parser --------------------------------------------------------------------------------------


class Parser:
    def __init__(self, src: str) -> None:
        self.toks = tokenize(src)
        self.i = 0

    def peek(self) -> Tok:
        return self.toks[self.i]

    def next(self) -> Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def is_word(self, *values: str) -> bool:
        t = self.peek()
        return t.kind == "WORD" and t.value in values

    def is_op(self, *values: str) -> bool:
        t = self.peek()
        return t.kind == "OP" and t.value in values

    def unexpected(self) -> ShSyntaxError:
        t = self.peek()
        if t.kind == "EOF":
            return ShSyntaxError("Syntax error: end of file unexpected", t.line)
        if t.kind == "NL":
            return ShSyntaxError("Syntax error: newline unexpected", t.line)
        return ShSyntaxError(f'Syntax error: "{t.value}" unexpected', t.line)

    def expect_word(self, value: str) -> None:
        if not self.is_word(value):
            t = self.peek()
            if t.kind == "EOF":
                raise ShSyntaxError(f'Syntax error: end of file unexpected (expecting "{value}")', t.line)
            raise self.unexpected_expecting(value)
        self.next()

    def unexpected_expecting(self, value: str) -> ShSyntaxError:
        t = self.peek()
        what = "newline" if t.kind == "NL" else f'"{t.value}"'
        return ShSyntaxError(f'Syntax error: {what} unexpected (expecting "{value}")', t.line)

    def skip_nl(self) -> None:
        while self.peek().kind == "NL":
            self.next()

    def parse(self) -> ListNode:
        self.skip_nl()
        body = self.list_(stop=set())
        if self.peek().kind != "EOF":
            raise self.unexpected()
        return body

    def body(self, stop: set[str]) -> ListNode:
        """A compound command's list: dash refuses an empty one (``if then`` -> ``"then" unexpected``)."""
        out = self.list_(stop)
        if not out.items:
            raise self.unexpected()
        return out

    def list_(self, stop: set[str]) -> ListNode:
        out = ListNode()
        while True:
            self.skip_nl()
            t = self.peek()
            if t.kind == "EOF" or (t.kind == "WORD" and t.value in stop) or (t.kind == "OP" and t.value in (")", ";;")):
                return out
            ao = self.and_or()
            bg = False
            if self.is_op("&"):
                self.next()
                bg = True
            elif self.is_op(";"):
                self.next()
            elif self.peek().kind == "NL":
                pass
            elif not (self.peek().kind == "EOF" or self.is_op(")", ";;") or
                      (self.peek().kind == "WORD" and self.peek().value in stop)):
                raise self.unexpected()
            out.items.append((ao, bg))

    def and_or(self) -> AndOr:
        ao = AndOr(self.pipeline())
        while self.is_op("&&", "||"):
            op = self.next().value
            self.skip_nl()
            ao.rest.append((op, self.pipeline()))
        return ao

    def pipeline(self) -> Pipeline:
        bang = False
        if self.is_word("!"):
            self.next()
            bang = True
        p = Pipeline([self.command()], bang)
        while self.is_op("|"):
            self.next()
            self.skip_nl()
            p.cmds.append(self.command())
        return p

    def command(self) -> Node:
        t = self.peek()
        if t.kind == "WORD":
            v = t.value
            if v == "if":
                return self._redirs_after(self.if_())
            if v in ("while", "until"):
                return self._redirs_after(self.loop())
            if v == "for":
                return self._redirs_after(self.for_())
            if v == "case":
                return self._redirs_after(self.case())
            if v == "{":
                self.next()
                body = self.list_({"}"})
                self.expect_word("}")
                return self._redirs_after(Group(body))
            if v in ("then", "elif", "else", "fi", "do", "done", "esac", "}", "in"):
                raise self.unexpected()
            nxt = self.toks[self.i + 1] if self.i + 1 < len(self.toks) else None
            if (nxt is not None and nxt.kind == "OP" and nxt.value == "(" and self.i + 2 < len(self.toks)
                    and self.toks[self.i + 2].kind == "OP" and self.toks[self.i + 2].value == ")"):
                self.i += 3
                self.skip_nl()
                return FuncDef(v, self.command())
        if t.kind == "OP" and t.value == "(":
            self.next()
            body = self.list_(set())
            if not self.is_op(")"):
                raise self.unexpected_expecting(")")
            self.next()
            return self._redirs_after(Group(body, subshell=True))
        return self.simple()

    def _redirs_after(self, node: Node) -> Node:
        while self.peek().kind == "IO" or self.is_op("<", ">", ">>", ">|", "<>", ">&", "<&", "<<", "<<-"):
            node.redirs.append(self.redir())  # type: ignore[union-attr]
        return node

    def redir(self) -> Redir:
        fd: int | None = None
        if self.peek().kind == "IO":
            fd = int(self.next().value)
        op = self.next().value
        t = self.peek()
        if t.kind != "WORD":
            raise self.unexpected()
        self.next()
        if op in ("<<", "<<-"):
            assert t.heredoc is not None
            return Redir(0 if fd is None else fd, "<<", t.heredoc)
        default = 0 if op in ("<", "<&", "<>") else 1
        return Redir(default if fd is None else fd, op, t.value)

    def simple(self) -> Simple:
        line = self.peek().line
        cmd = Simple([], [], [], line)
        while True:
            t = self.peek()
            if t.kind == "IO" or self.is_op("<", ">", ">>", ">|", "<>", ">&", "<&", "<<", "<<-"):
                cmd.redirs.append(self.redir())
            elif t.kind == "WORD":
                if not cmd.words and _is_assignment(t.value):
                    cmd.assigns.append(t.value)
                else:
                    cmd.words.append(t.value)
                self.next()
            else:
                break
        if not cmd.words and not cmd.assigns and not cmd.redirs:
            raise self.unexpected()
        return cmd

    def if_(self) -> If:
        self.expect_word("if")
        clauses = []
        cond = self.body({"then"})
        self.expect_word("then")
        body = self.body({"elif", "else", "fi"})
        clauses.append((cond, body))
        else_ = None
        while True:
            if self.is_word("elif"):
                self.next()
                cond = self.body({"then"})
                self.expect_word("then")
                clauses.append((cond, self.body({"elif", "else", "fi"})))
            elif self.is_word("else"):
                self.next()
                else_ = self.body({"fi"})
            else:
                self.expect_word("fi")
                return If(clauses, else_)

    def loop(self) -> Loop:
        until = self.next().value == "until"
        cond = self.body({"do"})
        self.expect_word("do")
        body = self.body({"done"})
        self.expect_word("done")
        return Loop(cond, body, until)

    def for_(self) -> For:
        self.next()
        t = self.next()
        if t.kind != "WORD":
            raise ShSyntaxError('Syntax error: Bad for loop variable', t.line)
        words: list[str] | None = None
        self.skip_nl()
        if self.is_word("in"):
            self.next()
            words = []
            while self.peek().kind == "WORD":
                words.append(self.next().value)
        if self.is_op(";"):
            self.next()
        self.skip_nl()
        self.expect_word("do")
        body = self.body({"done"})
        self.expect_word("done")
        return For(t.value, words, body)

    def case(self) -> Case:
        self.next()
        word = self.next().value
        self.skip_nl()
        self.expect_word("in")
        arms: list[tuple[list[str], ListNode]] = []
        while True:
            self.skip_nl()
            if self.is_word("esac"):
                self.next()
                return Case(word, arms)
            if self.is_op("("):
                self.next()
            pats = [self.next().value]
            while self.is_op("|"):
                self.next()
                pats.append(self.next().value)
            if not self.is_op(")"):
                raise self.unexpected_expecting(")")
            self.next()
            body = self.list_({"esac"})
            arms.append((pats, body))
            if self.is_op(";;"):
                self.next()


def _is_assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and bool(name) and (name[0].isalpha() or name[0] == "_") and all(
        c.isalnum() or c == "_" for c in name)


def parse(src: str) -> ListNode:
    return Parser(src).parse()
