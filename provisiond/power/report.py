"""Per-node results as people and scripts read them: a table, or JSON; an exit code."""

from __future__ import annotations

from provisiond.errors import BmcError
from provisiond.power.fanout import NodeResult

COLUMNS = ["NODE", "RESULT", "DETAIL"]


def print_results(ctx, results: list[NodeResult], as_json: bool, rows=None,
                  columns: list[str] = COLUMNS) -> int:
    """Print the results (`rows(result)` gives a node's table rows); the exit code is
    non-zero if any node failed."""
    if as_json:
        ctx.print_json([r.to_data() for r in results])
    else:
        rows = rows or result_rows
        ctx.print_table(columns, [row for r in results for row in rows(r)])
    return exit_code(results)


def result_rows(result: NodeResult) -> list[list]:
    return [[result.node, "ok" if result.ok else "error", result.detail]]


def exit_code(results: list[NodeResult]) -> int:
    return 0 if all(r.ok for r in results) else BmcError.exit_code
