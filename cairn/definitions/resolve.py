"""From a definition's name to what ``cairn`` does with it: the source and review hash a
launch sends (cairnd reviews the source again and freezes it only if the hashes agree), the
hash an exposure pins, and the listing of every launchable definition."""

from __future__ import annotations

from pathlib import Path

from cairn.definitions import registry, trust, user
from cairn.definitions.builtin import builtin_names, builtin_source
from cairn.definitions.files import check_name
from cairn.errors import UsageError
from cairn.protocol.definitions import DEFINITION_RE
from cairn.workflow.review import Review, review_source


def split(definition: str) -> tuple[str, str]:
    """(namespace, name) of ``builtin:``, ``user:`` or ``project:`` NAME."""
    match = DEFINITION_RE.match(definition)
    if match is None:
        namespace, sep, name = definition.partition(":")
        if sep and namespace in ("builtin", "user", "project"):
            check_name(name, namespace)
        raise UsageError(
            f"{definition!r} is not a definition",
            hint="name one as builtin:NAME, user:NAME or project:NAME, or give a FILE.py",
        )
    return match.group(1), match.group(2)


def for_launch(definition: str, project_fd: int, project_root: str) -> tuple[str, str]:
    """(source, review hash) of a ``user:`` or ``project:`` definition, as the person
    installed or trusted it; ``project:`` is read from the launched project's directory."""
    namespace, name = split(definition)
    if namespace == "user":
        record = user.installed(name)
        user.checked_review(record)
        return record.source, record.review_hash
    if namespace == "project":
        return trust.trusted_definition(project_fd, project_root, name)
    raise UsageError(f"{definition}: cairnd resolves builtin definitions itself")


def refuse_draft_file(file: Path, what: str) -> None:
    """A file in the drafts directory is inert: refused for ``what`` (launched, exposed)."""
    if user.is_draft(file):
        raise user.draft_refusal(user.default_name(file), what)


def exposable_hash(definition: str) -> str:
    """The review hash ``definition`` would be exposed at: an installed ``user:`` one (as
    installed) or a builtin; drafts, files and ``project:`` definitions are refused."""
    if definition.endswith(".py"):
        refuse_draft_file(Path(definition), "exposed")
        raise UsageError(
            f"{definition} is a file; only installed definitions can be exposed",
            hint=f"install it with 'cairn workflow install {definition} --confirm sha256:…' "
            "and expose user:NAME",
        )
    return current_review(definition).review_hash


def current_review(definition: str) -> Review:
    """The review of an installed ``user:`` definition (checked against its install record)
    or a builtin, as it is now; a ``project:`` definition is refused (never exposed)."""
    namespace, name = split(definition)
    if namespace == "user":
        return user.checked_review(user.installed(name, purpose="exposed"))
    if namespace == "builtin":
        source, filename = builtin_source(name)
        return review_source(source, filename=filename)
    raise UsageError(
        f"{definition} cannot be exposed: project definitions are never exposed",
        hint="install it as a user: definition to expose it",
    )


def listing() -> list[dict[str, str]]:
    """Every launchable definition, and those of trusted projects that are not (changed,
    missing, added after trust): definition, review hash, status, exposure, where."""
    exposed = registry.exposed_hashes()
    rows: list[dict[str, str]] = []

    def add(definition: str, review_hash: str, status: str, where: str) -> None:
        pinned = exposed.get(definition)
        shown = "" if pinned is None else "yes" if pinned == review_hash else "stale"
        rows.append(
            {
                "definition": definition,
                "review_hash": review_hash,
                "status": status,
                "exposed": shown,
                "where": where,
            }
        )

    for name in builtin_names():
        source, filename = builtin_source(name)
        add(f"builtin:{name}", review_source(source, filename=filename).review_hash, "builtin", "")
    for record in user.all_installed():
        add(f"user:{record.name}", record.review_hash, "installed", record.installed_from)
    for root, project in sorted(trust.load_trust().projects.items()):
        for name, (status, review_hash) in trust.project_status(project).items():
            add(f"project:{name}", review_hash, status, root)
    return rows
