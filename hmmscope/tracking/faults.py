"""A store's failures told apart and said in one line: an error of a store at all
(`store_error`, by class name), a fault waiting does not cure (`permanent_fault`: a full disk, a read-only store), and
the store's own reason (`store_reason`: the innermost database error's first line).

Imports nothing: the CLI's one-line errors (`cli.common.user_errors`) and the sweep worker use it.
"""

from __future__ import annotations

# A store's failures that waiting does not cure: said at once, never waited out as an outage
PERMANENT_FAULTS = ("database or disk is full", "no space left on device", "disk quota exceeded",
                    "attempt to write a readonly database", "read-only file system")


def _chain(e: BaseException) -> list[BaseException]:
    """`e` and the exceptions behind it (__cause__, __context__, a DB-API error's `orig`), outermost first."""
    out: list[BaseException] = []
    todo = [e]
    while todo and len(out) < 20:
        x = todo.pop(0)
        if x is None or any(x is y for y in out):
            continue
        out.append(x)
        todo += [getattr(x, "orig", None), x.__cause__, x.__context__]
    return out


def permanent_fault(e: BaseException) -> str | None:
    """The store's own reason when `e` is a fault waiting does not cure (a full disk, a read-only store), else None."""
    for x in _chain(e):
        text = str(x).lower()
        for f in PERMANENT_FAULTS:
            if f in text:
                return f
    return None


STORE_ERRORS = ("MlflowException", "SQLAlchemyError", "DatabaseError", "RequestException", "StorageInternalError")


def store_error(e: BaseException) -> bool:
    """An error of MLflow, SQLAlchemy, sqlite3, requests or Optuna's storages (by class name: no imports here)."""
    return any(c.__name__ in STORE_ERRORS for c in type(e).__mro__)


def store_reason(e: BaseException) -> str:
    """One line for a store's failure, with the store's own reason: the innermost database error's first line (sqlite3
    'database or disk is full', not SQLAlchemy's or MLflow's wrapping 'raised as a result of Query-invoked autoflush'),
    after the outer exception's type."""
    chain = _chain(e)
    inner = [x for x in chain if type(x).__module__.split(".")[0] in ("sqlite3", "psycopg2", "psycopg", "pymysql")]
    root = inner[-1] if inner else chain[-1]
    lines = str(root).strip().splitlines()
    why = lines[0] if lines else type(root).__name__
    return f"{type(e).__name__}: {why}" if root is e else f"{type(e).__name__}: {type(root).__name__}: {why}"
