"""Structured outputs (notebook 18): grammar-constrained decoding.

A JSON Schema becomes a regular expression (``schema``), the expression a byte-level automaton
(``automaton``), the automaton a token-level index over the vocabulary (``index``), and the
index one mask per decoding step (``grammar.constrain``; rows of a batch each keep their own
``GrammarState``). The server uses it for ``response_format`` and ``tool_choice``.
"""

from minimind_lib.inference.structured.automaton import (
    DFA,
    compile_regex,
    parse_regex,
    utf8_sequences,
)
from minimind_lib.inference.structured.grammar import (
    Constraint,
    call_schema,
    constrain,
    constrain_reply,
    constrain_tool_calls,
    tool_grammar,
    vocabulary,
)
from minimind_lib.inference.structured.index import GrammarState, TokenIndex, TokenVocabulary
from minimind_lib.inference.structured.schema import SchemaError, schema_to_regex, validate

__all__ = ["DFA", "Constraint", "GrammarState", "SchemaError", "TokenIndex", "TokenVocabulary",
           "call_schema", "compile_regex", "constrain", "constrain_reply",
           "constrain_tool_calls", "parse_regex", "schema_to_regex", "tool_grammar",
           "utf8_sequences", "validate", "vocabulary"]
