"""The screen ``orchestrator sql`` puts a statement through before it reaches the database.

The connection's own read-only-ness (SQLite ``mode=ro`` and an authorizer, a PostgreSQL READ
ONLY transaction as a reader role: ``Dialect.readonly_query``) is the real guard against
writes; the screen refuses, with one line, what a read-only connection still lets a reader
do to the server.

- PostgreSQL: the statement is parsed by PostgreSQL's own parser (``pglast``), so quoting,
  schema qualification, Unicode escapes (``U&"..."``) and string rules (``'\\'`` is a whole
  string) are read exactly as the server reads them. Exactly one statement, a SELECT (WITH,
  VALUES and TABLE are SELECTs to the parser), an EXPLAIN of one, or a SHOW; no SELECT INTO
  and no row locks (``FOR UPDATE``); and every function called anywhere in it (FROM
  included) is one of :data:`PG_READ_FUNCTIONS`, unqualified or in ``pg_catalog``: an allow
  list of read functions, so advisory locks, ``set_config``, ``pg_sleep``,
  ``pg_terminate_backend``, ``query_to_xml`` (SQL hidden in a string), ``dblink``,
  ``lo_import`` and ``pg_read_file`` are refused however they are spelled.
- SQLite: one statement (``sqlparse`` splits it) starting with a reading keyword. Functions
  are not screened by name: the authorizer SQLite calls for each function sees its resolved
  name, and ``load_extension`` is disabled on the connection (Python's default).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from orchestrator.errors import UserError

READ_ONLY = "`orchestrator sql` is read-only"

# What a SQLite read may start with (the first keyword of the statement).
SQLITE_READ_STATEMENTS = frozenset({"select", "with", "values", "explain", "pragma"})

# Functions a PostgreSQL read may call: what the queries of the docs, the tests and the
# analyses use, and the rest of PostgreSQL's pure functions of the same families. Names are
# as the parser resolves them (unquoted identifiers lower-cased), including the functions
# SQL syntax turns into calls (EXTRACT, SUBSTRING ... FROM, TRIM, POSITION, OVERLAY, AT TIME
# ZONE, OVERLAPS, SIMILAR TO, NORMALIZE). Anything else is refused.
PG_READ_FUNCTIONS = frozenset(
    {
        # aggregates
        "count", "sum", "avg", "min", "max", "every", "bool_and", "bool_or", "bit_and", "bit_or", "bit_xor",
        "string_agg", "array_agg", "json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg",
        "json_agg_strict", "jsonb_agg_strict", "json_object_agg_strict", "jsonb_object_agg_strict",
        "json_object_agg_unique", "jsonb_object_agg_unique", "any_value",
        "stddev", "stddev_pop", "stddev_samp", "variance", "var_pop", "var_samp",
        "corr", "covar_pop", "covar_samp", "regr_avgx", "regr_avgy", "regr_count", "regr_intercept",
        "regr_r2", "regr_slope", "regr_sxx", "regr_sxy", "regr_syy",
        "percentile_cont", "percentile_disc", "mode", "range_agg", "range_intersect_agg",
        # window functions
        "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead",
        "first_value", "last_value", "nth_value",
        # math
        "abs", "ceil", "ceiling", "floor", "round", "trunc", "sign", "sqrt", "cbrt", "exp", "ln", "log",
        "log10", "power", "pow", "mod", "div", "pi", "degrees", "radians", "width_bucket", "gcd", "lcm",
        "factorial", "scale", "min_scale", "trim_scale", "random", "random_normal",
        "sin", "cos", "tan", "cot", "asin", "acos", "atan", "atan2", "sind", "cosd", "tand", "cotd",
        "asind", "acosd", "atand", "atan2d", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
        "erf", "erfc", "isfinite",
        # strings
        "length", "char_length", "character_length", "octet_length", "bit_length", "lower", "upper",
        "initcap", "substr", "substring", "left", "right", "lpad", "rpad", "ltrim", "rtrim", "btrim",
        "replace", "repeat", "reverse", "split_part", "strpos", "position", "concat", "concat_ws",
        "format", "md5", "sha224", "sha256", "sha384", "sha512", "encode", "decode", "to_hex", "ascii",
        "chr", "regexp_replace", "regexp_match", "regexp_matches", "regexp_split_to_array",
        "regexp_split_to_table", "regexp_count", "regexp_instr", "regexp_like", "regexp_substr",
        "starts_with", "translate", "quote_ident", "quote_literal", "quote_nullable", "overlay",
        "string_to_array", "string_to_table", "array_to_string", "normalize", "is_normalized", "unistr",
        "similar_to_escape", "similar_escape", "like_escape", "to_char", "to_number", "to_date",
        "to_timestamp", "convert_from", "convert_to", "casefold",
        # dates and times
        "now", "clock_timestamp", "statement_timestamp", "transaction_timestamp", "timeofday",
        "date_trunc", "date_part", "extract", "age", "date_bin", "make_date", "make_time",
        "make_timestamp", "make_timestamptz", "make_interval", "justify_days", "justify_hours",
        "justify_interval", "timezone", "overlaps", "date_add", "date_subtract",
        # JSON
        "to_json", "to_jsonb", "row_to_json", "array_to_json", "json_build_object", "jsonb_build_object",
        "json_build_array", "jsonb_build_array", "json_object", "jsonb_object", "json_array_length",
        "jsonb_array_length", "json_array_elements", "jsonb_array_elements", "json_array_elements_text",
        "jsonb_array_elements_text", "json_each", "jsonb_each", "json_each_text", "jsonb_each_text",
        "json_extract_path", "jsonb_extract_path", "json_extract_path_text", "jsonb_extract_path_text",
        "json_object_keys", "jsonb_object_keys", "json_typeof", "jsonb_typeof", "json_strip_nulls",
        "jsonb_strip_nulls", "jsonb_pretty", "jsonb_set", "jsonb_set_lax", "jsonb_insert",
        "json_populate_record", "jsonb_populate_record", "json_populate_recordset",
        "jsonb_populate_recordset", "json_to_record", "jsonb_to_record", "json_to_recordset",
        "jsonb_to_recordset", "jsonb_path_exists", "jsonb_path_match", "jsonb_path_query",
        "jsonb_path_query_array", "jsonb_path_query_first", "json_scalar", "json_serialize",
        # arrays and ranges
        "array_length", "cardinality", "unnest", "array_position", "array_positions", "array_remove",
        "array_replace", "array_append", "array_prepend", "array_cat", "array_dims", "array_ndims",
        "array_lower", "array_upper", "array_fill", "array_sample", "array_shuffle", "trim_array",
        "generate_series", "generate_subscripts", "isempty", "lower_inc", "upper_inc", "lower_inf",
        "upper_inf", "range_merge", "multirange",
        # nulls, types, casts written as calls
        "num_nulls", "num_nonnulls", "pg_typeof", "format_type", "to_regclass", "to_regtype",
        "int2", "int4", "int8", "float4", "float8", "numeric", "text", "bool", "date", "varchar",
        "gen_random_uuid",
        # reading the catalog and settings (SHOW reads the same)
        "version", "current_database", "current_schema", "current_schemas", "current_setting",
        "obj_description", "col_description", "shobj_description", "pg_get_viewdef", "pg_get_indexdef",
        "pg_get_constraintdef", "pg_size_pretty", "pg_size_bytes", "pg_relation_size",
        "pg_total_relation_size", "pg_table_size", "pg_indexes_size", "pg_database_size",
        "pg_collation_for",
    }
)  # fmt: skip

# Statements PostgreSQL's parser gives for a read (TABLE, VALUES and WITH are SelectStmt).
_PG_READS = ("SelectStmt", "ExplainStmt", "VariableShowStmt")


def one_statement(sql: str) -> str:
    """The one statement of ``sql`` (UserError when it is empty or holds more than one),
    split as SQLite reads it (sqlparse: quotes, comments and ``$$`` strings understood)."""
    import sqlparse

    if not sql.strip():
        raise UserError("empty query")
    pieces = [p for p in sqlparse.split(sql) if _meaningful(p)]
    if not pieces:
        raise UserError("empty query (only comments)")
    if len(pieces) > 1:
        raise UserError(_many(len(pieces)))
    return pieces[0]


def _many(n: int) -> str:
    return f"one statement at a time ({n} given): `orchestrator sql` runs a single read-only statement"


def _meaningful(stmt: str) -> bool:
    """Whether a piece of a split holds more than whitespace, comments and semicolons."""
    import sqlparse

    for tok in sqlparse.parse(stmt)[0].flatten() if stmt.strip() else ():
        if (
            tok.is_whitespace
            or tok.ttype in sqlparse.tokens.Comment
            or (tok.ttype is sqlparse.tokens.Punctuation and tok.value == ";")
        ):
            continue
        return True
    return False


def screen_sqlite(sql: str) -> None:
    """UserError unless ``sql`` is one statement starting with a reading keyword of SQLite."""
    import sqlparse

    piece = one_statement(sql)
    words = [
        tok.value.lower()
        for tok in sqlparse.parse(piece)[0].flatten()
        if not (tok.is_whitespace or tok.ttype in sqlparse.tokens.Comment)
    ]
    first = words[0] if words else ""
    if first not in SQLITE_READ_STATEMENTS:
        allowed = ", ".join(sorted(w.upper() for w in SQLITE_READ_STATEMENTS))
        raise UserError(f"refused: {READ_ONLY}: it runs {allowed}, not {_shown(first.upper())}")


def _shown(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _nodes(obj: Any) -> Iterator[Any]:
    """Every node of a pglast parse tree, depth first."""
    from pglast import ast

    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, (tuple, list)):
            stack.extend(reversed(o))
        elif isinstance(o, ast.Node):
            yield o
            # (each node class names its fields in its own __slots__)
            stack.extend(getattr(o, name) for name in reversed(tuple(vars(type(o)).get("__slots__", ()))))


def screen_postgresql(sql: str) -> None:
    """UserError (one line) unless ``sql``, parsed as PostgreSQL parses it, is one read
    statement calling only read functions (see the module docstring)."""
    from pglast import ast
    from pglast.parser import ParseError, parse_sql

    if not sql.strip():
        raise UserError("empty query")
    try:
        stmts = parse_sql(sql)
    except ParseError as exc:
        raise UserError(f"query refused: it does not parse as PostgreSQL ({_first_line(exc)})") from None
    if not stmts:
        raise UserError("empty query (only comments)")
    if len(stmts) > 1:
        raise UserError(_many(len(stmts)))
    stmt = stmts[0].stmt
    kind = type(stmt).__name__
    if kind not in _PG_READS:
        raise UserError(
            f"refused: {READ_ONLY}: it runs SELECT (WITH, VALUES, TABLE), EXPLAIN of a SELECT and SHOW, "
            f"not {_statement_word(kind)}"
        )
    for node in _nodes(stmt):
        name = type(node).__name__
        if name.endswith("Stmt") and name not in _PG_READS:
            raise UserError(f"refused: {READ_ONLY}: the statement holds {_statement_word(name)}")
        if isinstance(node, ast.ExplainStmt) and not isinstance(node.query, ast.SelectStmt):
            raise UserError(f"refused: {READ_ONLY}: EXPLAIN runs on a SELECT only")
        if isinstance(node, ast.SelectStmt):
            if node.intoClause is not None:
                raise UserError(f"refused: {READ_ONLY}: SELECT INTO creates a table")
            if node.lockingClause:
                raise UserError(f"refused: {READ_ONLY}: row locks (FOR UPDATE/SHARE) are not reads")
        if isinstance(node, ast.FuncCall):
            names = [str(getattr(p, "sval", "")) for p in node.funcname or ()]
            schema = names[0] if len(names) == 2 else None
            if len(names) > 2 or (len(names) == 2 and schema != "pg_catalog") or names[-1] not in PG_READ_FUNCTIONS:
                shown = _shown(".".join(names), 80).encode("unicode_escape").decode("ascii")
                raise UserError(
                    f"refused: {READ_ONLY}: {shown}() is not one of its read functions "
                    "(aggregates, math, string, date/time, JSON, arrays; see docs/how-to/sql.md)"
                )


def _statement_word(kind: str) -> str:
    words = {
        "InsertStmt": "INSERT",
        "UpdateStmt": "UPDATE",
        "DeleteStmt": "DELETE",
        "MergeStmt": "MERGE",
        "TransactionStmt": "transaction control",
        "VariableSetStmt": "SET",
        "CopyStmt": "COPY",
        "DoStmt": "DO",
        "CallStmt": "CALL",
        "LockStmt": "LOCK",
        "TruncateStmt": "TRUNCATE",
    }
    return words.get(kind, kind.removesuffix("Stmt"))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
