"""What a reference names in the run database, for every command alike: a run or sweep by a hex prefix of its id
(matched literally), a sweep by its name; a reference that could name two sweeps is refused, never chosen."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from flctl.db.schema import Sweep

ID_PREFIX = re.compile(r"[0-9a-fA-F]{4,64}")


def is_id_prefix(text: str) -> bool:
    """Run and sweep ids are hex; a reference to one gives at least 4 and at most 64 of its digits."""
    return ID_PREFIX.fullmatch(text) is not None


def by_prefix(s: Session, table: Any, prefix: str, what: str) -> Any:
    """The row of ``table`` (Run, Sweep) whose id starts with the hex ``prefix`` (matched literally), None where none
    does; ConfigError where several do. Runs and sweeps are looked up by prefix alike."""
    prefix = prefix.lower()
    matches = s.scalars(select(table).where(table.id.startswith(prefix, autoescape=True))
                        .order_by(table.id).limit(6)).all()
    if len(matches) > 1:
        from flctl.errors import ConfigError

        ids = [m.id for m in matches]
        more = ", ..." if len(ids) > 5 else ""
        raise ConfigError(f"{what} id prefix {prefix!r} matches several {what}s ({', '.join(ids[:5])}{more}); "
                          "give more digits")
    return matches[0] if matches else None


def find_sweep(s: Session, ref: str) -> Sweep | None:
    """The sweep ``ref`` names (Store.get_sweep): its id, else its name (the latest of that name) or a unique prefix
    of its id; a name that is also the start of another sweep's id is a ConfigError naming both (neither is chosen
    silently)."""
    from flctl.errors import ConfigError
    from flctl.text import shown

    if (sweep := s.get(Sweep, ref)) is not None:
        return sweep
    named = s.scalars(select(Sweep).where(Sweep.name == ref).order_by(Sweep.created_at.desc())).first()
    prefixed = by_prefix(s, Sweep, ref, "sweep") if is_id_prefix(ref) else None
    if named is not None and prefixed is not None and named.id != prefixed.id:
        raise ConfigError(f"{shown(ref)} is the name of sweep {named.id} and the start of sweep {prefixed.id}'s id; "
                          "give the full id of the one you mean")
    return named or prefixed


def name_clash(s: Session, name: str | None, sweep_id: str) -> tuple[str | None, str | None]:
    """What a new sweep ``sweep_id`` named ``name`` does to references, before it is recorded: (refusal, warning).
    A name that is the start of another sweep's id would be refused as ambiguous by every reader (find_sweep), so it
    is refused now, naming that sweep. A new id that starts with another sweep's name makes that name ambiguous, but
    an id is not the user's choice (it is the grid's hash): the launch goes on, and the warning says to name that
    sweep by its id from now on."""
    from flctl.text import shown

    refusal = warning = None
    if name is not None and is_id_prefix(name):
        other = s.scalars(select(Sweep.id).where(Sweep.id.startswith(name.lower(), autoescape=True),
                                                 Sweep.id != sweep_id).limit(1)).first()
        if other is not None:
            refusal = (f"--name {shown(name)} is the start of sweep {other}'s id: every command would refuse it as "
                       "ambiguous; choose another name")
    prefixes = [sweep_id[:k] for k in range(4, len(sweep_id) + 1)]
    named = s.scalars(select(Sweep).where(Sweep.name.in_(prefixes + [p.upper() for p in prefixes]),
                                          Sweep.id != sweep_id).limit(1)).first()
    if named is not None and named.name is not None:
        warning = (f"sweep {named.id}'s name {shown(named.name)} is the start of this sweep's id ({sweep_id}): a "
                   f"reference {shown(named.name)} is now ambiguous; name that sweep by its id")
    return refusal, warning
